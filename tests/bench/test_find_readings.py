"""The strict readings of an answer (bench/_readings.py) and the reader of the GPU's recorded find rows
(bench/find_readings.py): each reading apart, on the H200's and H100's own files, with the figures
README.md and docs/benchmarks.md state."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import find_readings
from _readings import read
from _truth import Curve

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "data" / "cpu-2026-11-28" / "find-readings.json"
SCAN = "bench/data/h200-2026-11-26-2/find-cuda-smoke-builtins.json"
BISECTED = "bench/data/h200-2026-11-26/find-cuda-resnet50-amp-resnet50-mlp-cnn-transformer.json"


def _three(path: str) -> list[tuple[str, int, bool | None, bool | None, bool | None]]:
    rows, why = find_readings.read_file(path)
    assert why is None
    found = [row["methods"]["batchfit"] for row in rows]
    return [
        (row["workload"], ours["answer"], ours["largest"], ours["none_below_fails"], ours["trains"])
        for row, ours in zip(rows, found, strict=True)
    ]


def test_the_h200_scan_reads_each_band_apart() -> None:
    # mlp: 494-512 fail above 493 up to the bound (513-543 fit past it); cnn: 203 and 208 fit above
    # 192; transformer: 141-144 and 149-152 fail below 156. Each passed the weak check.
    assert _three(SCAN) == [
        ("mlp", 493, True, True, True),
        ("cnn", 192, False, True, True),
        ("transformer", 156, True, False, True),
    ]
    rows, _ = find_readings.read_file(SCAN)
    assert [row["methods"]["batchfit"]["weak_exact"] for row in rows] == [True, True, True]
    assert rows[1]["methods"]["batchfit"]["fitting_above"] == "203, 208"
    assert rows[2]["methods"]["batchfit"]["failing_below"] == "141-144, 149-152"
    assert rows[2]["methods"]["batchfit"]["below"] == "137-155"


def test_a_bisection_reads_no_but_yes_only_at_the_bound() -> None:
    # The bisection probed the answer and the size above: 'largest' is read yes only at 512, the
    # bound; no size below any answer was probed; resnet50-amp's 241 has 242 fitting above it.
    assert _three(BISECTED) == [
        ("resnet50", 124, None, None, True),
        ("resnet50 (cudnn.benchmark)", 124, None, None, True),
        ("resnet50-amp", 241, False, None, True),
        ("mlp", 512, True, None, True),
        ("cnn", 160, None, None, True),
        ("transformer", 156, None, None, True),
    ]


def test_an_answer_that_fails_reads_no_and_failures_below_it_read_no() -> None:
    # Expandable segments on the H200: every answer failed 10 steps; the cnn's bisection went down
    # through 134 (fails) to 133; the mlp's to 1, which failed.
    path = "bench/data/h200-2026-11-26/find-cuda-expandable-cnn-transformer-mlp-resnet50-amp.json"
    assert _three(path) == [
        ("resnet50-amp", 243, False, None, False),
        ("mlp", 256, False, False, False),
        ("cnn", 138, False, False, False),
        ("transformer", 168, False, None, False),
    ]


def test_a_reading_is_yes_no_or_not_measured_on_points() -> None:
    points = {9: True, 10: False, 11: True, 12: True, 13: False}
    assert (
        read(points, 12, 16, True, scanned=True).largest,
        read(points, 12, 16, True, True).none_below_fails,
    ) == (
        True,
        False,
    )
    assert read(points, 9, 16, None, scanned=True).largest is False  # 11 and 12 fit above
    assert read(points, 9, 11, None, scanned=False).fitting_above == "11"
    assert read(points, 12, 16, True, scanned=False).largest is None  # no scan: not measured
    assert read(points, 12, 12, True, scanned=False).largest is True  # at its bound
    assert read(points, 13, 16, True, scanned=False).largest is False  # it fails
    assert read(points, 12, 16, True, scanned=True).strict is False


def test_the_results_file_is_what_the_reader_gives_and_the_docs_say() -> None:
    recorded = json.loads(RESULTS.read_text())
    rows = [row for path in recorded["files"] for row in find_readings.read_file(path)[0]]
    assert recorded["rows"] == rows
    assert recorded["skipped"] == {
        path: "no find rows (a recording of trials near the boundaries, not an answer judged)"
        for path in (
            "bench/data/h100-2026-11-25/find-curves-cuda-cnn-transformer.json",
            "bench/data/h100-2026-11-25/find-curves-cuda-resnet50-amp.json",
        )
    }
    scan = recorded["summary"][SCAN]
    assert scan["counts"]["strict"] == {"yes": 1, "no": 2, "not_measured": 0}
    assert scan["weak_exact"] == 3 and len(scan["weak_exact_not_strict"]) == 2
    # 20 rows; the weak check holds in 15, all three strict readings in 1 (the H200's mlp at 493).
    assert len(rows) == 20
    assert sum(row["methods"]["batchfit"]["weak_exact"] for row in rows) == 15
    assert [row["workload"] for row in rows if row["methods"]["batchfit"]["strict"] is True] == ["mlp"]


def test_find_s_rows_and_summary_read_the_h200_transformer_s_bands_apart(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import _find_rows
    import find as find_bench

    # The H200's transformer curve: the answer 156 tops a band above two failing ones.
    recorded = json.loads((ROOT / SCAN).read_text())
    curve = Curve.from_dict(recorded["rows"][2]["truth"])
    ours = find_bench.MethodResult(156, [2, 4, 160, 155, 157, 156], 1.0, 1.0)
    row = _find_rows.Row(find_bench.Case("transformer", "ref:128"), 2**28, curve, ours, {})
    assert row.verdict("batchfit") is not None and row.verdict("batchfit").exact  # type: ignore[union-attr]
    readings = _find_rows.row_dict(row)["readings"]["batchfit"]
    assert (readings["largest"], readings["none_below_fails"], readings["trains"], readings["strict"]) == (
        True,
        False,
        True,
        False,
    )
    assert readings["failing_below"] == "141-144, 149-152" and readings["above"] == "157-175"
    # A boundary check (--window 0) reads no yes from its few sizes.
    assert _find_rows.row_dict(row, window=0)["readings"]["batchfit"]["largest"] is None
    _find_rows.print_summary([row], "cuda")
    out = capsys.readouterr().out
    assert "batchfit: exact 1/1" in out
    assert "  strictly, the largest fitting size probed up to its bound: 1/1 (not measured: 0)" in out
    assert "  strictly, no failure probed below it: 0/1 (not measured: 0)" in out
    assert "  NOT STRICT: transformer at ref:128: 156: yes / no: 141-144, 149-152 fail / yes" in out

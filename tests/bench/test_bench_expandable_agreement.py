"""The model of expandable segments against what the H200 recorded with ``expandable_segments:True``
(bench/expandable_agreement.py): the H200's default-allocator requests replayed on the expandable
allocator at the points of ``find-cuda-expandable-*.json``, with the figures docs/search.md states."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import expandable_agreement

from batchfit.runtime.devices.caching_device import EXPANDABLE_CONFIRM_STEPS

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "data" / "cpu-2026-11-28" / "expandable-agreement.json"
MIB = 2**20


def _recorded() -> dict[str, dict[str, Any]]:
    rows = json.loads((ROOT / expandable_agreement.TRUTH).read_text())["rows"]
    return {row["case"]["workload"]: row for row in rows}


def _fits(workload: str, sizes: tuple[int, ...], steps: int, gap_mib: int = 0) -> dict[int, bool]:
    cap = _recorded()[workload]["cap_bytes"]
    replay = expandable_agreement.predictors(workload, gap_mib)[steps]
    return {size: replay.play(size, cap).fits for size in sizes}


def test_a_fresh_process_holds_the_resident_state_packed_in_each_pool_s_pages() -> None:
    history = expandable_agreement._histories.histories("mlp")[2]
    record = expandable_agreement._histories.expandable_record_of(history)
    assert record.expandable and record.places == ()
    # cuBLAS's two 32 MiB workspaces and the weights fill 4 large pages; the rest of the 4th is free.
    assert record.start == (
        ((49664, True), (1048576, True), (998912, False)),
        ((32 * MIB, True), (32 * MIB, True), (7405568, True), (9371648, False)),
    )
    shifted = expandable_agreement._histories.expandable_record_of(history, 2 * MIB, 1000)
    assert shifted.start[1] == ((2 * MIB, False), *record.start[1][:3], (1024, True), (7273472, False))


def test_the_mlp_s_edge_is_where_the_h200_s_first_instance_had_it_and_its_place_decides() -> None:
    # The H200: batchfit's instance fitted 256 (10 steps) and failed 257; the truth's, on a model
    # built after three others, failed even 1. Under 108 MiB the resident state's 82 MiB of pages
    # leave room for one 20 MiB page more: the resident state 2 MiB into its page fails every size.
    assert _fits("mlp", (1, 256, 257), 10) == {1: True, 256: True, 257: False}
    assert _fits("mlp", (1, 256, 257), 20) == {1: True, 256: True, 257: False}
    assert _fits("mlp", (1, 256), 10, gap_mib=2) == {1: False, 256: False}


def test_the_transformer_s_model_is_lightning_s_instance_which_the_truth_s_contradicts() -> None:
    # Lightning's instance trained 176 for 20 steps and failed 177; the truth's failed 168 in 10.
    assert _fits("transformer", (167, 168, 176, 177), 10) == {167: True, 168: True, 176: True, 177: False}
    assert _fits("transformer", (167, 168, 176, 177), 20) == {167: True, 168: True, 176: True, 177: False}
    points = expandable_agreement.points(_recorded()["transformer"])
    pairs = expandable_agreement.contradictions(points)
    assert len(pairs) == 10
    assert pairs[0] == ["lightning check", 176, 20, "truth", 168, 10]


def test_with_expandable_segments_resnet50_amp_settles_past_10_steps_and_within_the_device_s_40() -> None:
    # Replayed under the H200's 10.5 GiB: with expandable segments the largest size that trains 10
    # steps (245) fails at step 18, and 244 trains 40 (its state recurs); with the default
    # allocator 243 trains 40 as it trains 10. CUDA confirms 40 steps under the setting.
    histories = expandable_agreement._histories.histories("resnet50-amp")
    cap = _recorded()["resnet50-amp"]["cap_bytes"]
    expandable = {
        size: expandable_agreement._histories.expandable_record_of(h) for size, h in histories.items()
    }
    replay = expandable_agreement.CapacityPredictor(expandable, 10, True).replays[0][1]
    verdicts = {
        (size, steps): replay.fits(size, cap, steps, True)
        for size, steps in ((245, 10), (245, 17), (245, 18), (246, 10), (244, EXPANDABLE_CONFIRM_STEPS))
    }
    assert verdicts == {(245, 10): True, (245, 17): True, (245, 18): False, (246, 10): False, (244, 40): True}
    default = {size: expandable_agreement._histories.record_of(h) for size, h in histories.items()}
    replay = expandable_agreement.CapacityPredictor(default, 10, True).replays[0][1]
    assert [replay.fits(size, cap, steps, True) for size, steps in ((243, 10), (243, 40), (244, 10))] == [
        True,
        True,
        False,
    ]


def test_the_h200_s_points_with_the_steps_each_ran() -> None:
    points = expandable_agreement.points(_recorded()["resnet50-amp"])
    ours = [
        (p["who"], p["size"], p["steps"], p["fits"])
        for p in points
        if p["who"].startswith(("truth", "batchfit"))
    ]
    assert ours == [
        ("truth", 242, 10, True),
        ("truth", 243, 10, False),
        ("batchfit trial", 2, 2, True),
        ("batchfit trial", 4, 2, True),
        ("batchfit trial", 243, 10, True),
        ("batchfit trial", 244, 10, False),
        ("batchfit check", 243, 20, False),
    ]
    every = [expandable_agreement.points(row) for row in _recorded().values()]
    assert sum(len(found) for found in every) == 128
    assert sum(len(expandable_agreement.contradictions(found)) for found in every) == 22


def test_the_gpu_session_s_expandable_stage_runs_the_truth_then_the_histories_under_the_setting(
    tmp_path: Path,
) -> None:
    # A Python that says what it was asked stands in for the GPU machine's (--plan covers the smoke).
    python = tmp_path / "python"
    python.write_text('#!/bin/bash\necho "RUN: ${PYTORCH_CUDA_ALLOC_CONF:-} $*"\n')
    python.chmod(0o755)
    env = {"PATH": "/usr/bin:/bin", "OUT": str(tmp_path / "out"), "PYTHON": str(python)}
    script = str(ROOT / "bench" / "gpu_session.sh")
    done = subprocess.run(["bash", script, "expandable"], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    ran = [line[5:] for line in done.stdout.splitlines() if line.startswith("RUN: ") and " -c " not in line]
    out = tmp_path / "out"
    find = "bench/find.py --device cuda --workloads mlp,cnn,transformer,resnet50-amp"
    assert ran == [
        f"expandable_segments:True {find} --json {out}/find-cuda-expandable.json",
        *(
            f"expandable_segments:True bench/allocator_history.py --device cuda --workload {workload} "
            f"--json {out}/allocator-history-cuda-expandable-{workload}.json"
            for workload in ("mlp", "cnn", "transformer", "resnet50-amp")
        ),
    ]


@pytest.mark.slow
def test_the_committed_results_are_this_code_s() -> None:
    # docs/search.md's table is rendered from the results file (tests/bench/test_tables.py); the
    # bench replays every point at 10 offsets of the resident state (about 40 s).
    rows = expandable_agreement.rows()
    committed = json.loads(RESULTS.read_text())
    for ours, theirs in zip(rows, committed["rows"], strict=True):
        assert ours == theirs, ours["workload"]
    total = expandable_agreement.summary(rows)
    assert committed["summary"] == total
    assert (total["agreeing"], total["points"], total["judged_agreeing"], total["judged"]) == (
        107,
        128,
        11,
        20,
    )
    assert (total["judged_agreeing_with_unrecorded"], total["steps_matter"]) == (12, 0)

"""``batchfit report`` and ``--report``, run for real as ``python -m batchfit`` subprocesses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import batchfit
from batchfit.units import format_bytes

SRC = Path(batchfit.__file__).resolve().parents[1]  # absolute: the subprocesses run in tmp_path
FIND = ("find", "--example", "mlp", "--device", "cpu", "--memory-limit", "48MiB", "--max-batch-size", "1024")


def batchfit_run(cwd: Path, *argv: str, prelude: str = "") -> subprocess.CompletedProcess[str]:
    code = f"import sys; {prelude}from batchfit.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run(
        [sys.executable, "-c", code, *argv],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(SRC)},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_find_writes_json_and_a_report_and_report_renders_the_saved_json(tmp_path: Path) -> None:
    found = batchfit_run(tmp_path, *FIND, "--format", "json", "--output", "x.json", "--report", "r2.html")
    assert found.returncode == 0, found.stderr
    assert "batchfit: wrote report r2.html" in found.stderr
    reported = batchfit_run(tmp_path, "report", "x.json", "-o", "r.html")
    assert reported.returncode == 0, reported.stderr
    assert reported.stderr == "batchfit: wrote report r.html\n"
    document = json.loads((tmp_path / "x.json").read_text())
    assert {"created_at", "torch_version", "batchfit_version"} <= document.keys()
    for page in ("r.html", "r2.html"):
        text = (tmp_path / page).read_text()
        assert text.count("<svg") == 1
        for result in document["results"]:
            assert f"answer batch_size={result['batch_size']}" in text
            assert f"capacity {format_bytes(result['capacity_bytes'])}" in text
        assert f'<td class="time">{document["created_at"]}</td>' in text


def test_without_matplotlib_report_says_which_extra_to_install_before_any_search(tmp_path: Path) -> None:
    # None in sys.modules makes `import matplotlib` fail as it does where it is not installed.
    absent = "sys.modules['matplotlib'] = None; "
    found = batchfit_run(tmp_path, *FIND, "--report", "r.html", prelude=absent)
    reported = batchfit_run(tmp_path, "report", "x.json", "-o", "r.html", prelude=absent)
    for run in (found, reported):
        assert run.returncode == 1
        assert run.stderr.splitlines()[0] == (
            "batchfit: error: the report needs matplotlib, which is not installed: "
            "pip install 'batchfit[report]'"
        )
    assert "batch_size=" not in found.stderr  # no trial ran
    assert list(tmp_path.iterdir()) == []


def test_explore_records_what_ran_and_writes_its_report(tmp_path: Path) -> None:
    explored = batchfit_run(
        tmp_path,
        *("explore", "--example", "mlp", "--device", "cpu", "--max-batch-size", "32"),
        *("--time-budget-seconds", "1", "--format", "json", "--output", "e.json", "--report", "e.html"),
    )
    assert explored.returncode == 0, explored.stderr
    document = json.loads((tmp_path / "e.json").read_text())
    assert document["workload"] == "mlp" and document["device"] == "cpu" and document["tolerance"] == 0.03
    assert {"created_at", "torch_version", "batchfit_version", "points", "recommendation"} <= document.keys()
    text = (tmp_path / "e.html").read_text()
    assert text.count("<svg") == 1
    assert "tolerance 0.03 under the best" in text  # the band is drawn from the recorded tolerance
    assert f'<td class="time">{document["created_at"]}</td>' in text

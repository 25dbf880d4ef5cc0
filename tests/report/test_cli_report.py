"""``batchfit report`` and ``--report``, run for real as ``python -m batchfit`` subprocesses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import batchfit
from batchfit.report import recognise
from batchfit.units import format_bytes

SRC = Path(batchfit.__file__).resolve().parents[1]  # absolute: the subprocesses run in tmp_path
FIND = ("find", "--example", "mlp", "--device", "cpu", "--memory-limit", "48MiB", "--max-batch-size", "1024")


def batchfit_run(
    cwd: Path, *argv: str, prelude: str = "", pythonpath: Path | None = None
) -> subprocess.CompletedProcess[str]:
    code = f"import sys; {prelude}from batchfit.cli import main; sys.exit(main(sys.argv[1:]))"
    paths = [str(SRC)] + ([str(pythonpath)] if pythonpath is not None else [])
    return subprocess.run(
        [sys.executable, "-c", code, *argv],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(paths)},
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
    assert {"command", "versions", "created_at"} <= document.keys()
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
        assert run.returncode == 2  # a configuration error: the extra is missing
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
    (result,) = document["results"]
    assert document["workload"] == "mlp" and result["device"] == "cpu" and document["tolerance"] == 0.03
    assert {"command", "created_at", "versions"} <= document.keys()
    assert {"points", "recommendation"} <= result.keys()
    text = (tmp_path / "e.html").read_text()
    assert text.count("<svg") == 1
    assert "tolerance 0.03 under the best" in text  # the band is drawn from the recorded tolerance
    assert f'<td class="time">{document["created_at"]}</td>' in text


TESTS = Path(__file__).resolve().parents[1]  # data_workloads.py, for check-data
MLP = ("--example", "mlp", "--device", "cpu", "--memory-limit", "48MiB")
WITH_REPORT = {  # command: (its argv, writing x.json; what follows --report; the plots its page holds)
    "analyze": (
        ("analyze", "--cfg", str(TESTS.parent / "examples" / "exp.yaml"), "--fractions", "0.6,0.8"),
        ("--output", "x.json"),
        ("WORKLOAD", "example:mlp", "MEMORY_LIMIT", "64MiB"),  # the config's overrides come last
        1,
    ),
    "compare": (
        ("compare", *MLP, "--techniques", "baseline,amp", "--windows", "1", "--time-budget-seconds", "0"),
        ("--format", "json", "--output", "x.json"),
        (),
        1,
    ),
    "check-data": (
        ("check-data", "--workload", "data_workloads:sleepy", "--batch-size", "32", "--device", "cpu"),
        ("--max-num-workers", "1", "--window-seconds", "0.2", "--format", "json", "--output", "x.json"),
        (),
        1,
    ),
    "noise-scale": (
        (
            "noise-scale",
            "--example",
            "mlp",
            "--device",
            "cpu",
            "--batch-size",
            "64",
            "--micro-batch-size",
            "16",
        ),
        ("--steps", "4", "--format", "json", "--output", "x.json"),
        (),
        1,
    ),
    "advise": (
        ("advise", *MLP, "--techniques", "baseline,amp", "--time-budget-seconds", "20"),
        ("--format", "json", "--output", "x.json"),
        (),
        3,  # find (train and eval), explore, compare (a budget that fits them); no plan without a base lr
    ),
}


@pytest.mark.parametrize("command", sorted(WITH_REPORT))
def test_each_command_records_what_ran_and_writes_the_report_that_report_renders(
    tmp_path: Path, command: str
) -> None:
    argv, output, overrides, plots = WITH_REPORT[command]
    ran = batchfit_run(tmp_path, *argv, *output, "--report", "direct.html", *overrides, pythonpath=TESTS)
    assert ran.returncode == 0, ran.stderr
    assert "batchfit: wrote report direct.html" in ran.stderr
    document = json.loads((tmp_path / "x.json").read_text())
    assert recognise(document) == command
    assert {"command", "versions", "workload", "created_at", "results"} <= document.keys()
    assert document["workload"] == ("sleepy" if command == "check-data" else "mlp")
    reported = batchfit_run(tmp_path, "report", "x.json", "-o", "again.html")
    assert reported.returncode == 0, reported.stderr
    for page in ("direct.html", "again.html"):
        text = (tmp_path / page).read_text()
        assert text.count("<svg") == plots
        assert f'<td class="time">{document["created_at"]}</td>' in text
        assert f'<td class="workload">{document["workload"]}</td>' in text
        assert "http://" not in text and "https://" not in text


@pytest.mark.parametrize("command", sorted(WITH_REPORT))
def test_without_matplotlib_every_report_flag_fails_before_any_work(tmp_path: Path, command: str) -> None:
    argv, _, overrides, _ = WITH_REPORT[command]
    absent = "sys.modules['matplotlib'] = None; "
    ran = batchfit_run(tmp_path, *argv, "--report", "r.html", *overrides, prelude=absent, pythonpath=TESTS)
    assert ran.returncode == 2
    assert ran.stderr.splitlines()[0] == (
        "batchfit: error: the report needs matplotlib, which is not installed: pip install 'batchfit[report]'"
    )
    assert "batch_size=" not in ran.stderr and "samples/s" not in ran.stderr  # nothing ran
    assert list(tmp_path.iterdir()) == []


def test_predict_writes_a_report_and_report_renders_its_saved_json(tmp_path: Path) -> None:
    predicted = batchfit_run(
        tmp_path,
        *("predict", "--example", "cnn", "--device", "cpu", "--capacities", "2GiB", "--gpus", "T4"),
        *("--modes", "train", "--format", "json", "--output", "p.json", "--report", "r2.html"),
    )
    assert predicted.returncode == 0, predicted.stderr
    assert "batchfit: wrote report r2.html" in predicted.stderr
    reported = batchfit_run(tmp_path, "report", "p.json", "-o", "r.html")
    assert reported.returncode == 0, reported.stderr
    document = json.loads((tmp_path / "p.json").read_text())
    assert recognise(document) == "predict"
    for page in ("r.html", "r2.html"):
        text = (tmp_path / page).read_text()
        assert text.count("<svg") == 1 and '<section class="result predict">' in text
        for row in document["results"][0]["rows"]:
            assert f">{row['train']['batch_size']}<" in text or f">{row['train']['batch_size']}+<" in text
        assert "cuDNN&#x27;s convolution workspaces" in text  # the CPU alone names what it cannot model

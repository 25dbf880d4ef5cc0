"""``batchfit check-data`` run for real: a loader factory's JSON result, and bad input's one line.

The two subprocesses are started side by side once per module (``runs``); each imports torch. They
run from tests/, where ``data_workloads`` is importable.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import batchfit
from batchfit.cli import main

TESTS = Path(__file__).resolve().parent.parent
SOURCE = Path(batchfit.__file__).resolve().parent.parent  # the batchfit under test, for the runs
HINT = "(set BATCHFIT_DEBUG=1 to see the traceback)"
FACTORY_NOTE = (
    "prefetch_factor, pin_memory, persistent_workers not tried: loader=sleepy_loader has no such parameter."
)
COMMANDS = {
    "factory-json": (
        *("check-data", "--workload", "data_workloads:sleepy", "--loader", "data_workloads:sleepy_loader"),
        *("--batch-size", "32", "--device", "cpu", "--window-seconds", "0.3", "--format", "json"),
    ),
    "example-without-data": ("check-data", "--example", "mlp", "--batch-size", "32", "--device", "cpu"),
}


@pytest.fixture(scope="module")
def runs() -> Iterator[dict[str, subprocess.CompletedProcess[str]]]:
    env = {key: value for key, value in os.environ.items() if key != "BATCHFIT_DEBUG"}
    env["OMP_NUM_THREADS"] = "1"  # the two runs share the machine's cores
    # This checkout's batchfit, whatever the working directory and an editable install elsewhere say.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SOURCE), env.get("PYTHONPATH")]))
    started = {
        name: subprocess.Popen(
            [sys.executable, "-m", "batchfit", *args],
            cwd=TESTS,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, args in COMMANDS.items()
    }
    done = {}
    for name, process in started.items():
        stdout, stderr = process.communicate(timeout=300)
        done[name] = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
    yield done


def test_a_loader_factory_through_the_command_line(runs: dict[str, subprocess.CompletedProcess[str]]) -> None:
    done = runs["factory-json"]
    assert done.returncode == 0, done.stderr
    (document,) = json.loads(done.stdout)["results"]
    assert document["source"] == "loader=sleepy_loader" and document["batch_size"] == 32
    assert document["bottleneck"] and document["data_wait_share"] > 0.4
    # The factory takes batch_size and num_workers: nothing else is varied, and the notes say so.
    rows = document["settings"]
    assert rows[0]["num_workers"] == 0 and len({row["num_workers"] for row in rows}) == len(rows) >= 2
    assert all(row["prefetch_factor"] is None and not row["pin_memory"] for row in rows)
    assert document["notes"] == [FACTORY_NOTE]
    advice = document["recommendation"]
    assert advice["setting"]["num_workers"] >= 1 and advice["gain"] > 1.5, document["summary"]
    assert advice["data_wait_share"] < document["threshold"]
    # The default budget (60 s) is the whole check's, and it left nothing out here.
    assert document["time_budget_seconds"] == 60.0 and document["not_measured"] == []
    # stderr: a line as each pass starts (the loader alone, the step alone, then the loader feeding
    # the step at each setting) with the time left, one per setting as it is measured, then the
    # summary with the check's time; notes every few seconds inside a long pass.
    lines = [line for line in done.stderr.splitlines() if not line.startswith("batchfit: note: ")]
    started = [line for line in lines if line.startswith("batchfit: check-data: ")]
    assert len(started) == 2 + len(rows)
    assert all(line.endswith(" s of the time budget left)...") for line in started), started
    settings = [line for line in lines if not line.startswith("batchfit: check-data: ")]
    assert len(settings) == len(rows) + 1
    for line, row in zip(settings, rows, strict=False):
        assert line.startswith(f"batchfit: num_workers={row['num_workers']} ")
    assert lines[-1].startswith(f"batchfit: {document['summary']} (")


def test_an_example_without_a_dataset_is_one_clean_error(
    runs: dict[str, subprocess.CompletedProcess[str]],
) -> None:
    done = runs["example-without-data"]
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == [
        (
            "batchfit: error: check_data needs batches from a DataLoader, and workload 'mlp' makes "
            "them with make_batch; give the Workload a map-style dataset (dataset=..., collate_fn=...) "
            "or pass loader=a factory (batch_size=..., num_workers=...) -> DataLoader (on the command "
            "line: --loader MODULE:FUNCTION)."
        ),
        HINT,
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(
            ["--workload", "data_workloads:sleepy", "--batch-size", "0"],
            "batch_size must be a positive integer, got 0.",
            id="batch-size-0",
        ),
        pytest.param(
            [
                "--workload",
                "data_workloads:sleepy",
                "--batch-size",
                "8",
                "--loader",
                "data_workloads:missing",
            ],
            "loader 'data_workloads:missing': data_workloads has no function 'missing'.",
            id="loader-missing",
        ),
        pytest.param(
            ["--workload", "data_workloads:sleepy", "--batch-size", "8", "--persistent-workers"],
            "persistent_workers=True needs num_workers > 0 (the DataLoader refuses it without workers); "
            "pass num_workers >= 1 or leave persistent_workers at its default.",
            id="persistent-without-workers",
        ),
    ],
)
def test_main_rejects_in_process(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("BATCHFIT_DEBUG", raising=False)
    monkeypatch.chdir(TESTS)
    monkeypatch.setattr(sys, "path", list(sys.path))  # load_function adds the working directory
    assert main(["check-data", *args, "--device", "cpu"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"batchfit: error: {message}\n{HINT}\n"

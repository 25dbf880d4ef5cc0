"""The gpu tests no GPU session has passed (bench/gpu_tests_run.py, bench/gpu_never_run.txt): each
recorded log read again against the collection its results file holds, with the counts the docs state."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import gpu_tests_run

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "data" / "cpu-2026-11-28" / "gpu-tests-run.json"


@pytest.fixture(scope="module")
def recorded() -> dict:
    return json.loads(RESULTS.read_text())


def test_each_log_reads_as_its_results_file_says(recorded: dict) -> None:
    logs = {log["log"]: log for log in recorded["logs"]}
    assert [Path(path).name for path in logs] == [
        "gpu-tests.log",
        "smoke-gpu-tests.log",
        "smoke-adapters.log",
        "gpu-tests-first-failure.log",
    ]
    for path, log in logs.items():
        text = (ROOT / path).read_text()
        assert gpu_tests_run.outcomes(text, log["collected"]) == log["outcomes"]
        assert gpu_tests_run.progress(text) == log["progress"]
    # (progress characters, tests collected at its commit, what the summary counts, tally)
    assert [
        (len(log["progress"]), len(log["collected"]), log["summary_count"], log["tally"])
        for log in logs.values()
    ] == [
        (32, 32, 32, {"failed": 1, "passed": 31}),  # the first H200 session: every gpu test then
        (22, 41, None, {"failed": 1, "passed": 21}),  # the smoke, stopped at 140 s: 22 of 41 ran
        (2, 2, 2, {"passed": 2}),  # the adapters
        (1, 0, 1, {"failed": 1}),  # DDP's test alone, named by its FAILED line
    ]
    ddp = (
        "tests/runtime/distributed/test_lockstep.py::"
        "test_on_cuda_a_model_in_ddp_is_searched_with_the_buckets_its_allocator_holds"
    )
    assert logs["bench/data/h200-2026-11-26-2/smoke-gpu-tests.log"]["outcomes"][ddp] == "failed"


def test_the_never_run_list_is_every_gpu_test_no_log_shows_passed(recorded: dict) -> None:
    missing = gpu_tests_run.never_run(recorded["logs"], recorded["gpu_tests_now"])
    listed = [line for line in gpu_tests_run.NEVER_RUN.read_text().splitlines() if not line.startswith("#")]
    assert missing == recorded["never_run"] == listed
    assert len(recorded["gpu_tests_now"]) == 43 and len(missing) == 10
    assert (
        "tests/prediction/test_predict.py::test_on_cuda_the_prediction_at_a_capped_capacity_is_within_3_percent_of_find"
        in missing
    )
    # The CLI on cuda passed in the first session; explore on cuda has never run (each node id counts).
    passed = "tests/test_gpu.py::test_the_cli_runs_on_cuda[cuda]"
    assert passed in recorded["gpu_tests_now"] and passed not in missing
    assert "tests/test_gpu.py::test_every_command_runs_on_the_gpu_it_is_given[explore]" in missing


def test_a_log_longer_than_its_collection_is_refused() -> None:
    with pytest.raises(ValueError, match="3 outcomes but 2 tests collected: not the same run"):
        gpu_tests_run.outcomes("F..\n", ["tests/a.py::x", "tests/a.py::y"])


@pytest.mark.slow
def test_the_gpu_tests_collected_now_are_those_the_results_file_holds(recorded: dict) -> None:
    # A gpu test added or renamed since the list was written: run python bench/gpu_tests_run.py.
    assert gpu_tests_run.collect(ROOT, ("-m", "gpu")) == recorded["gpu_tests_now"]


def test_a_test_passed_under_the_path_its_file_had_then_has_passed() -> None:
    log = {"outcomes": {"tests/test_predict.py::a": "passed", "tests/test_predict.py::b": "failed"}}
    now = ["tests/prediction/test_predict.py::a", "tests/prediction/test_predict.py::b"]
    assert gpu_tests_run.never_run([log], now) == ["tests/prediction/test_predict.py::b"]

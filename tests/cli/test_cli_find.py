"""The ``batchfit`` command line, run for real: ``python -m batchfit`` and the ``batchfit`` script.

Each run is a fresh Python that imports torch (2-3 s of CPU), so all of them are declared up
front (``RUNS`` and ``BAD_INPUTS``) and started side by side, once per module, by the ``cli``
fixture; the tests then read the finished processes.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

import batchfit
from batchfit import BatchSizes, find_batch_size
from batchfit.cli import main
from batchfit.runtime.steps.techniques import compiler_unavailable
from batchfit.runtime.workloads.examples import build_example
from batchfit.units import format_bytes

TESTS = Path(__file__).resolve().parent
SCRIPT = Path(sys.executable).with_name("batchfit")
HINT = "(set BATCHFIT_DEBUG=1 to see the traceback)"
PROGRESS = re.compile(
    r"^batchfit: (?P<mode>train|eval) +batch_size=(?P<batch>\d+) +(?P<outcome>ok|oom|over_budget) +peak "
)
SUMMARY = re.compile(r"^batchfit: (?P<mode>train|eval): batch_size=(?P<batch>\d+) \(peak ")
MLP_48 = (
    "find",
    "--example",
    "mlp",
    "--device",
    "cpu",
    "--memory-limit",
    "48MiB",
    "--max-batch-size",
    "1024",
)


@dataclass(frozen=True)
class Run:
    """One CLI invocation. ``{tmp}`` in an argument is the run's own temporary directory."""

    args: tuple[str, ...]
    in_tests: bool = False  # cwd tests/, where workloads_for_cli is importable (else the temp dir)
    script: bool = False  # the console script next to sys.executable instead of ``python -m``
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Bad:
    """A bad invocation, the fragments its one error line must hold, in order, and its exit code
    (2: a usage or configuration error; 1: the run's negative answer)."""

    run: Run
    message: tuple[str, ...]
    code: int = 2


@dataclass(frozen=True)
class Done:
    process: subprocess.CompletedProcess[str]
    tmp: Path

    @property
    def returncode(self) -> int:
        return self.process.returncode

    @property
    def stdout(self) -> str:
        return self.process.stdout

    @property
    def stderr(self) -> str:
        return self.process.stderr


RUNS: dict[str, Run] = {
    "mlp-json": Run((*MLP_48, "--modes", "train,eval", "--format", "json")),
    "transformer-text": Run(
        ("find", "--example", "transformer", "--device", "cpu", "--memory-limit", "32MiB")
    ),
    "multiple-of-8": Run((*MLP_48, "--multiple-of", "8", "--format", "json")),
    "confirm-steps": Run((*MLP_48, "--modes", "train", "--confirm-steps", "10", "--format", "json")),
    # The script's sys.path does not hold the working directory: batchfit must add it.
    "workload-script": Run(
        (
            *("find", "--workload", "workloads_for_cli:tiny", "--device", "cpu"),
            *("--memory-limit", "256KiB", "--format", "json"),
        ),
        in_tests=True,
        script=True,
    ),
    "workload-with-device": Run(
        (
            "find",
            "--workload",
            "workloads_for_cli:tiny_on",
            "--device",
            "cpu",
            "--memory-limit",
            "256KiB",
            "--modes",
            "train",
            "--format",
            "json",
        ),
        in_tests=True,
    ),
    "workload-compiled": Run(
        (
            *("find", "--workload", "workloads_for_cli:compiled_tiny", "--device", "cpu"),
            *("--memory-limit", "256KiB", "--modes", "train", "--format", "json"),
        ),
        in_tests=True,
    ),
    "output-file": Run((*MLP_48, "--modes", "eval", "--format", "json", "--output", "{tmp}/result.json")),
    "output-missing-dir": Run(
        (*MLP_48, "--modes", "eval", "--max-batch-size", "4", "--output", "{tmp}/missing/result.json")
    ),
    "debug-traceback": Run(
        ("find", "--workload", "workloads_for_cli:not_a_workload"),
        in_tests=True,
        env={"BATCHFIT_DEBUG": "1"},
    ),
}


def _mlp_parameter_bytes() -> str:
    model = build_example("mlp", "cpu").model
    return format_bytes(sum(p.untyped_storage().nbytes() for p in model.parameters()))


def _bad(*args: str, message: tuple[str, ...], in_tests: bool = False, code: int = 2) -> Bad:
    """A bad ``find`` on the CPU, unless the arguments name a device."""
    device = () if "--device" in args else ("--device", "cpu")
    return Bad(Run(("find", *args, *device), in_tests=in_tests), message, code)


BAD_INPUTS: dict[str, Bad] = {
    "min-above-max": _bad(
        "--example", "mlp", "--min-batch-size", "10", "--max-batch-size", "5",
        message=(
            "min_batch_size (10) is larger than max_batch_size (5); pass min_batch_size <= max_batch_size.",
        ),
    ),
    "min-batch-0": _bad(
        "--example", "mlp", "--min-batch-size", "0",
        message=("min_batch_size must be a positive integer, got 0.",),
    ),
    "fraction-1.5": _bad(
        "--example", "mlp", "--memory-fraction", "1.5",
        message=("memory_fraction=1.5 must be in (0, 1]: the share of device memory a batch may use.",),
    ),
    "fraction-0": _bad(
        "--example", "mlp", "--memory-fraction", "0",
        message=("memory_fraction=0.0 must be in (0, 1]",),
    ),
    "device-tpu": _bad(
        "--example", "mlp", "--device", "tpu",
        message=("device='tpu' is not a device: use 'cpu', 'cuda' or 'cuda:N'.",),
    ),
    "device-cuda-absent": _bad(
        "--example", "mlp", "--device", "cuda",
        message=(
            "device='cuda' was asked for, but CUDA is not available in this process", "device='cpu'"
        ),
    ),
    "memory-limit-lots": _bad(
        "--example", "mlp", "--memory-limit", "lots",
        message=("memory_limit='lots' is not a size: write a number and a unit, such as '2GiB'",),
    ),
    "does-not-fit": _bad(
        "--example", "mlp", "--memory-limit", "1MiB",
        message=(
            "the train step does not fit even at batch_size=1 on cpu (capped at 1.00 MiB): it ran",
            " out of memory (",
            "DefaultCPUAllocator: can't allocate memory",
            "against a budget of 819.20 KiB (0.8 x 1.00 MiB).",
            f"The fixed part alone, parameters and buffers, takes {_mlp_parameter_bytes()} before",
        ),
        code=1,
    ),
    "confirm-steps-0": _bad(
        "--example", "mlp", "--confirm-steps", "0",
        message=("confirm_steps must be a positive integer, got 0.",),
    ),
    "modes-foo": _bad(
        "--example", "mlp", "--modes", "foo",
        message=("--modes 'foo': use a comma-separated list of train and eval (or val).",),
    ),
    "workload-no-colon": _bad(
        "--workload", "workloads_for_cli",
        message=("--workload 'workloads_for_cli' must be MODULE:FUNCTION, e.g. my_train:workload.",),
        in_tests=True,
    ),
    "workload-missing-module": _bad(
        "--workload", "no_such_module_for_batchfit:tiny",
        message=(
            "--workload 'no_such_module_for_batchfit:tiny': cannot import 'no_such_module_for_batchfit'",
            (" (No module named 'no_such_module_for_batchfit'); run batchfit from the folder that holds it, "
            "or add that folder to PYTHONPATH."),
        ),
        in_tests=True,
    ),
    "workload-missing-function": _bad(
        "--workload", "workloads_for_cli:missing",
        message=("--workload 'workloads_for_cli:missing': workloads_for_cli has no function 'missing'.",),
        in_tests=True,
    ),
    "workload-not-a-workload": _bad(
        "--workload", "workloads_for_cli:not_a_workload",
        message=("--workload 'workloads_for_cli:not_a_workload' returned dict, not a batchfit.Workload.",),
        in_tests=True,
    ),
}  # fmt: skip


def cli_env(**extra: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key != "BATCHFIT_DEBUG"}
    env["OMP_NUM_THREADS"] = "1"  # the runs share the machine's cores
    env.update(extra)
    return env


def execute(run: Run, tmp: Path) -> Done | None:
    if run.script and not SCRIPT.exists():
        return None
    command = [str(SCRIPT)] if run.script else [sys.executable, "-m", "batchfit"]
    process = subprocess.run(
        [*command, *(arg.format(tmp=tmp) for arg in run.args)],
        cwd=TESTS if run.in_tests else tmp,
        env=cli_env(**run.env),
        capture_output=True,
        text=True,
        timeout=300,
    )
    return Done(process, tmp)


@pytest.fixture(scope="module")
def cli(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Done | None]:
    """Every run of RUNS and BAD_INPUTS, finished; None where the console script is missing."""
    runs = {**RUNS, **{name: bad.run for name, bad in BAD_INPUTS.items()}}
    workers = max(2, min(8, os.cpu_count() or 2))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {
            name: pool.submit(execute, run, tmp_path_factory.mktemp(name)) for name, run in runs.items()
        }
        return {name: future.result() for name, future in futures.items()}


def finished(cli: dict[str, Done | None], name: str) -> Done:
    done = cli[name]
    if done is None:
        pytest.skip(f"no batchfit console script next to {sys.executable} (batchfit not pip-installed)")
    return done


def progress_lines(stderr: str, mode: str) -> list[tuple[int, str]]:
    found = [PROGRESS.match(line) for line in stderr.splitlines()]
    return [(int(m["batch"]), m["outcome"]) for m in found if m is not None and m["mode"] == mode]


def check_result(result: dict[str, Any], step: int = 1) -> None:
    """What each mode's result in the JSON document must satisfy."""
    for key in ("mode", "batch_size", "trials", "stop_reason", "search_seconds", "budget_bytes"):
        assert key in result, key
    assert result["mode"] in ("train", "eval")
    assert result["search_seconds"] > 0
    trials = result["trials"]
    assert isinstance(trials, list) and trials
    for trial in trials:
        assert isinstance(trial["batch_size"], int) and trial["batch_size"] % step == 0, trial
        assert trial["outcome"] in ("ok", "oom", "over_budget"), trial
        assert isinstance(trial["peak_bytes"], int) and trial["peak_bytes"] > 0, trial
        assert (trial["step_seconds"] is None) == (trial["outcome"] == "oom"), trial
    answer = [trial for trial in trials if trial["batch_size"] == result["batch_size"]]
    assert len(answer) == 1, trials
    assert answer[0]["outcome"] == "ok"
    assert answer[0]["peak_bytes"] == result["peak_bytes"] <= result["budget_bytes"]
    # Everything that fitted is at most the answer; everything that failed is above it.
    assert all(t["batch_size"] <= result["batch_size"] for t in trials if t["outcome"] == "ok")
    assert all(t["batch_size"] > result["batch_size"] for t in trials if t["outcome"] != "ok")
    if result["stop_reason"] == "boundary":
        following = [t for t in trials if t["batch_size"] == result["batch_size"] + step]
        assert len(following) == 1 and following[0]["outcome"] != "ok", trials
    else:
        assert result["stop_reason"] == "max_batch_size"
        assert result["batch_size"] == result["max_batch_size"] // step * step


# -- successful runs -------------------------------------------------------------------------------


def test_find_json_document(cli: dict[str, Done | None]) -> None:
    done = finished(cli, "mlp-json")
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)  # stdout holds the JSON document and nothing else
    assert (document["command"], document["workload"]) == ("find", "mlp")
    assert document["versions"]["batchfit"] == batchfit.__version__
    assert document["versions"]["torch"] == torch.__version__
    results = document["results"]
    assert [result["mode"] for result in results] == ["train", "eval"]
    for result in results:
        check_result(result)
        assert result["capacity_bytes"] == 48 * 2**20
        assert result["budget_bytes"] == int(0.8 * 48 * 2**20)
        assert result["memory_fraction"] == 0.8
        assert result["device"] == "cpu (capped at 48.00 MiB)"
        # 48 MiB is reached well below these bounds: the search stops at a measured boundary.
        assert result["stop_reason"] == "boundary"
    # --max-batch-size bounds train; eval's bound is twice it.
    assert [result["max_batch_size"] for result in results] == [1024, 2048]


def test_find_json_progress_goes_to_stderr_one_line_per_trial(cli: dict[str, Done | None]) -> None:
    done = finished(cli, "mlp-json")
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout)["results"]
    for result in results:
        trials = [(trial["batch_size"], trial["outcome"]) for trial in result["trials"]]
        assert progress_lines(done.stderr, result["mode"]) == trials
    summaries = [SUMMARY.match(line) for line in done.stderr.splitlines()]
    assert [(m["mode"], int(m["batch"])) for m in summaries if m] == [
        (result["mode"], result["batch_size"]) for result in results
    ]
    # And nothing else: the progress lines and one summary per mode.
    lines = done.stderr.splitlines()
    assert len(lines) == sum(len(result["trials"]) for result in results) + len(results)


def test_find_json_agrees_with_the_library(cli: dict[str, Done | None]) -> None:
    done = finished(cli, "mlp-json")
    assert done.returncode == 0, done.stderr
    workload = build_example("mlp", "cpu")
    for from_cli in json.loads(done.stdout)["results"]:
        from_api = find_batch_size(
            workload,
            from_cli["mode"],
            device="cpu",
            memory_limit="48MiB",
            sizes=BatchSizes(max_batch_size=from_cli["max_batch_size"]),
        )
        assert from_api.batch_size == from_cli["batch_size"]
        assert from_api.budget_bytes == from_cli["budget_bytes"]
        assert [(t.batch_size, t.outcome) for t in from_api.trials] == [
            (t["batch_size"], t["outcome"]) for t in from_cli["trials"]
        ]


def test_find_transformer_text_output(cli: dict[str, Done | None]) -> None:
    done = finished(cli, "transformer-text")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 5, done.stdout
    batches = {}
    for line, mode in zip(lines[:2], ("train", "eval"), strict=True):
        match = re.fullmatch(rf"{mode}_batch_size: (\d+)", line)
        assert match, line
        batches[mode] = int(match[1])
    assert lines[2] == ""
    stderr_lines = done.stderr.splitlines()
    for line, mode in zip(lines[3:], ("train", "eval"), strict=True):
        assert line.startswith(f"{mode}: batch_size={batches[mode]} (peak ")
        assert " budget = 0.8 x 32.00 MiB on cpu (capped at 32.00 MiB)); " in line
        # 128-token sequences take MiBs per sample: 32 MiB is a boundary for both modes.
        assert line.endswith("; stopped because the next larger candidate did not fit.")
        assert f"batchfit: {line}" in stderr_lines
        trials = dict(progress_lines(done.stderr, mode))
        assert trials[batches[mode]] == "ok"
        assert trials[batches[mode] + 1] in ("oom", "over_budget")
    assert 1 <= batches["train"] < batches["eval"]


def test_find_output_file(cli: dict[str, Done | None]) -> None:
    done = finished(cli, "output-file")
    assert done.returncode == 0, done.stderr
    output = done.tmp / "result.json"
    assert done.stdout == ""
    assert done.stderr.splitlines()[-1] == f"batchfit: wrote {output}"
    document = json.loads(output.read_text())
    assert document["workload"] == "mlp"
    assert [result["mode"] for result in document["results"]] == ["eval"]
    check_result(document["results"][0])


def test_find_output_file_in_a_missing_directory_is_a_clean_error(cli: dict[str, Done | None]) -> None:
    # Refused before any trial: a usage error (exit 2), not a search that ran and could not be saved.
    done = finished(cli, "output-missing-dir")
    output = done.tmp / "missing" / "result.json"
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        (
            f"batchfit: error: --output {output}: the folder {output.parent} does not exist; create it "
            f"first (mkdir -p {output.parent}) or write elsewhere."
        ),
        HINT,
    ]
    assert not output.parent.exists()


def test_find_multiple_of(cli: dict[str, Done | None]) -> None:
    done = finished(cli, "multiple-of-8")
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout)["results"]
    assert [result["mode"] for result in results] == ["train", "eval"]
    for result in results:
        assert result["multiple_of"] == 8
        assert result["batch_size"] % 8 == 0
        assert all(trial["batch_size"] % 8 == 0 for trial in result["trials"])
        check_result(result, step=8)
        assert result["stop_reason"] == "boundary"


def test_find_confirm_steps(cli: dict[str, Done | None]) -> None:
    # The confirming steps (the default on CUDA, asked for here on the CPU): the forecast places
    # the real trials at its answer, so each aims at the answer and runs 10 steps, and the answer
    # needs no trial of its own. Its progress lines say so, and the summary.
    done = finished(cli, "confirm-steps")
    assert done.returncode == 0, done.stderr
    (result,) = json.loads(done.stdout)["results"]
    assert result["confirm_steps"] == 10 and result["steps_per_trial"] == 2
    assert result["predicted_trials"] and result["stop_reason"] == "boundary"
    answer, larger = result["trials"]
    assert (answer["batch_size"], answer["steps"], answer["outcome"]) == (result["batch_size"], 10, "ok")
    assert larger["batch_size"] > result["batch_size"] and larger["outcome"] == "oom"
    lines = [line for line in done.stderr.splitlines() if PROGRESS.match(line)]
    assert len(lines) == len(result["trials"])
    assert lines[0].startswith(f"batchfit: train batch_size={result['batch_size']} ")
    assert "10 steps" in lines[0]
    assert "the answer confirmed over 10 steps" in done.stderr


def test_find_workload_from_a_module_with_the_console_script(cli: dict[str, Done | None]) -> None:
    done = finished(cli, "workload-script")
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert document["workload"] == "tiny-from-tests"
    assert [result["mode"] for result in document["results"]] == ["train", "eval"]
    for result in document["results"]:
        check_result(result)
        assert result["device"] == "cpu (capped at 256.00 KiB)"
        assert 1 < result["batch_size"] < result["max_batch_size"]
        assert result["stop_reason"] == "boundary"


def test_find_passes_the_device_to_a_workload_function_that_takes_one(cli: dict[str, Done | None]) -> None:
    done = finished(cli, "workload-with-device")
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert document["workload"] == "tiny-on-cpu"
    check_result(document["results"][0])


def test_find_measures_a_compiled_workload_and_the_profiler_is_quiet(
    cli: dict[str, Done | None],
) -> None:
    if reason := compiler_unavailable("cpu"):
        pytest.skip(reason)
    done = finished(cli, "workload-compiled")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)["results"][0]
    check_result(result)
    assert result["compiled"] == ["OptimizedModule (the model)"] and result["predicted_trials"] == []
    # libkineto writes a line at each profiler start and stop ("USDT: ... profiler_start"): not here.
    assert "profiler_start" not in done.stderr and "profiler_stop" not in done.stderr
    assert "measured as it runs, from the CPU allocator's events." in done.stderr


# -- errors: exit 2 (usage, configuration) or 1 (does not fit), one clean line on stderr ----------


@pytest.mark.parametrize("name", list(BAD_INPUTS))
def test_bad_input_is_one_clean_error(name: str, cli: dict[str, Done | None]) -> None:
    if name == "device-cuda-absent" and torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    done = finished(cli, name)
    assert done.returncode == BAD_INPUTS[name].code, done.stderr
    assert done.stdout == ""
    assert "Traceback" not in done.stderr
    lines = done.stderr.splitlines()
    assert lines[-1] == HINT
    errors = [line for line in lines if line.startswith("batchfit: error:")]
    assert len(errors) == 1, done.stderr
    assert lines[-2] == errors[0]
    assert all(PROGRESS.match(line) for line in lines[:-2]), done.stderr  # before it: trials only
    position = len("batchfit: error: ")
    for fragment in BAD_INPUTS[name].message:
        found = errors[0].find(fragment, position)
        assert found >= 0, f"{fragment!r} not in {errors[0][position:]!r}"
        position = found + len(fragment)


def test_does_not_fit_names_the_smallest_batch_it_tried(cli: dict[str, Done | None]) -> None:
    done = finished(cli, "does-not-fit")
    trials = progress_lines(done.stderr, "train")
    assert trials and all(outcome == "oom" for _, outcome in trials)
    assert min(batch for batch, _ in trials) == 1  # min_batch_size was tried, and failed
    assert "batchfit: error: the train step does not fit even at batch_size=1 " in done.stderr


def test_debug_variable_shows_the_traceback(cli: dict[str, Done | None]) -> None:
    done = finished(cli, "debug-traceback")
    assert done.returncode == 2
    assert done.stdout == ""
    assert "Traceback (most recent call last):" in done.stderr
    assert (
        "batchfit.errors.ConfigurationError: --workload 'workloads_for_cli:not_a_workload' returned dict"
        in done.stderr
    )
    assert done.stderr.splitlines()[-1] == (
        "batchfit: error: --workload 'workloads_for_cli:not_a_workload' returned dict, "
        "not a batchfit.Workload."
    )
    assert HINT not in done.stderr


# -- the same entry point in-process: the remaining bad inputs, cheaply ----------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(
            ["--example", "mlp", "--multiple-of", "0"],
            "multiple_of must be a positive integer, got 0.",
            id="multiple-of-0",
        ),
        pytest.param(
            ["--example", "mlp", "--steps-per-trial", "0"],
            "steps_per_trial must be a positive integer, got 0.",
            id="steps-per-trial-0",
        ),
        pytest.param(
            ["--example", "mlp", "--max-batch-size", "0"],
            "max_batch_size must be a positive integer, got 0.",
            id="max-batch-0",
        ),
        pytest.param(
            ["--example", "mlp", "--device", "meta"],
            (
                "device='meta' is not supported: batchfit measures 'cpu' and 'cuda' devices; a model "
                "built on the meta device is predicted from its shapes with batchfit.predict(workload, "
                "batchfit.Targets(capacities='24GiB'), device='cpu') (batchfit predict --device cpu "
                "--capacities 24GiB)."
            ),
            id="device-meta",
        ),
        pytest.param(
            ["--example", "mlp", "--modes", ","],
            "--modes ',': use a comma-separated list of train and eval (or val).",
            id="modes-empty",
        ),
        pytest.param(
            ["--workload", "workloads_for_cli:NOT_CALLABLE"],
            "--workload 'workloads_for_cli:NOT_CALLABLE': workloads_for_cli has no function 'NOT_CALLABLE'.",
            id="workload-not-callable",
        ),
        pytest.param(
            ["--example", "mlp", "--modes", "eval", "--min-batch-size", "10", "--max-batch-size", "5"],
            "min_batch_size (10) is larger than max_batch_size (5); pass min_batch_size <= max_batch_size.",
            id="eval-only-with-contradictory-bounds",
        ),
        pytest.param(
            ["--workload", "workloads_for_cli:needs_arguments"],
            (
                "--workload 'workloads_for_cli:needs_arguments': needs_arguments(size) cannot be called "
                "without arguments (missing a required argument: 'size'); the function must take none "
                "(or device=) and return a batchfit.Workload."
            ),
            id="workload-needs-arguments",
        ),
        pytest.param(
            ["--workload", ":tiny"],
            "--workload ':tiny' must be MODULE:FUNCTION, e.g. my_train:workload.",
            id="workload-no-module",
        ),
    ],
)
def test_main_rejects_in_process(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("BATCHFIT_DEBUG", raising=False)
    monkeypatch.chdir(TESTS)
    monkeypatch.setattr(sys, "path", list(sys.path))  # load_workload adds the working directory
    assert main(["find", *args, *(() if "--device" in args else ("--device", "cpu"))]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"batchfit: error: {message}\n{HINT}\n"


def test_unparsable_number_is_an_argparse_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["find", "--example", "mlp", "--memory-fraction", "half"])
    assert exit_info.value.code == 2
    assert "argument --memory-fraction: invalid float value: 'half'" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["0", "false", ""])
def test_debug_variable_off_values_show_no_traceback(
    value: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BATCHFIT_DEBUG", value)
    assert main(["find", "--example", "mlp", "--device", "cpu", "--memory-fraction", "2"]) == 2
    assert "Traceback" not in capsys.readouterr().err


# -- the library's parameter names said as the command line's flags --------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(
            ["--max-batch-size", "0"], "max_batch_size must be a positive integer, got 0.", id="max-batch-0"
        ),
        pytest.param(
            ["--min-batch-size", "20", "--max-batch-size", "16"],
            "min_batch_size (20) is larger than max_batch_size (16); pass min_batch_size <= max_batch_size.",
            id="min-above-max",
        ),
        pytest.param(
            ["--max-batch-size", "16", "--tolerance", "2"],
            "tolerance=2.0 must be in [0, 1), e.g. 0.03 for 3%.",
            id="tolerance-2",
        ),
        pytest.param(
            ["--max-batch-size", "16", "--confidence-target", "101"],
            "confidence_target=101 must be in [0, 100].",
            id="confidence-101",
        ),
        pytest.param(
            ["--max-batch-size", "10", "--multiple-of", "16"],
            "no multiple of 16 lies in [min_batch_size, max_batch_size] = [1, 10]; widen the range or "
            "change multiple_of.",
            id="no-candidate",
        ),
    ],
)
def test_explore_errors_name_its_parameters(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("BATCHFIT_DEBUG", raising=False)
    assert main(["explore", "--example", "mlp", "--device", "cpu", *args]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"batchfit: error: {message}\n{HINT}\n"

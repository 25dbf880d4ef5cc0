"""Exit codes a CI can read, from real ``python -m batchfit`` processes: 0 ok, 1 a negative answer
(``check``: does not fit; ``find``: not even the smallest batch fits) or a failed run, 2 a usage or
configuration error (a bad flag or value, a ``--workload`` that cannot be imported or found).

``check``'s runs are started side by side once (each is a fresh Python importing torch), its
boundary found first, in this process, by the library on the same workload; ``find``'s are in
test_cli_find. The usage error of every subcommand runs through ``main`` in this process, and in
processes of its own under the ``slow`` marker.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from workloads_for_cli import tiny

import batchfit
from batchfit.cli import main, parser

TESTS = Path(__file__).resolve().parent
HINT = "(set BATCHFIT_DEBUG=1 to see the traceback)"
#: The CPU capped where ``workloads_for_cli:tiny`` has a boundary inside the default range.
CAP = ("--device", "cpu", "--memory-limit", "256KiB")
TINY = ("--workload", "workloads_for_cli:tiny")
MISTYPED = ("--workload", "workloads_for_cli:nope")  # the module is there, the function is not
MISTYPED_ERROR = (
    "batchfit: error: --workload 'workloads_for_cli:nope': workloads_for_cli has no function 'nope'."
)
MISSING = ("--workload", "my_train_for_batchfit:workload")  # no such module
MISSING_ERROR = (
    "batchfit: error: --workload 'my_train_for_batchfit:workload': cannot import 'my_train_for_batchfit' "
    "(No module named 'my_train_for_batchfit'); run batchfit from the folder that holds it, or add that "
    "folder to PYTHONPATH."
)

#: One usage or configuration error per subcommand, past argparse (so batchfit's own check), and
#: its one error line.
USAGE_ERRORS: dict[str, tuple[tuple[str, ...], str]] = {
    "find": (("find", *MISTYPED, "--device", "cpu"), MISTYPED_ERROR),
    "explore": (("explore", *MISTYPED, "--device", "cpu"), MISTYPED_ERROR),
    "compare": (("compare", *MISTYPED, "--device", "cpu"), MISTYPED_ERROR),
    "check-data": (("check-data", *MISTYPED, "--batch-size", "8", "--device", "cpu"), MISTYPED_ERROR),
    "advise": (("advise", *MISTYPED, "--device", "cpu"), MISTYPED_ERROR),
    "analyze": (
        ("analyze", "--cfg", "no_such_config.yaml"),
        (f"batchfit: error: config file 'no_such_config.yaml' does not exist; pass the path of a YAML file "
        f"(relative to {TESTS})."),
    ),
    "plan": (
        ("plan", "--global-batch-size", "64", "--world-size", "0", "--micro-batch-size", "8",
         "--base-learning-rate", "0.1", "--base-batch-size", "64"),
        "batchfit: error: world_size must be a positive integer, got 0.",
    ),
    "predict": (("predict", *MISTYPED, "--device", "cpu", "--capacities", "24GiB"), MISTYPED_ERROR),
    "noise-scale": (("noise-scale", *MISTYPED, "--batch-size", "8", "--device", "cpu"), MISTYPED_ERROR),
    "check": (("check", *MISTYPED, "--batch-size", "8", "--device", "cpu"), MISTYPED_ERROR),
    "report": (
        ("report", "no_such_result.json", "-o", "page.html"),
        ("batchfit: error: no such result file: no_such_result.json; pass what a command wrote with "
        "--format json --output FILE."),
    ),
}  # fmt: skip


def test_the_usage_error_table_covers_every_subcommand() -> None:
    (commands,) = [a for a in parser()._actions if isinstance(a, argparse._SubParsersAction)]
    assert sorted(USAGE_ERRORS) == sorted(commands.choices)


def _runs(fits: int) -> dict[str, tuple[str, ...]]:
    """``check``'s run for each code. ``find``'s are test_cli_find's (its ``BAD_INPUTS`` hold a
    mistyped function and a missing module, exit 2, and a cap nothing fits, exit 1)."""
    return {
        "check-fits": ("check", *TINY, "--batch-size", str(fits), *CAP),
        "check-does-not-fit": ("check", *TINY, "--batch-size", str(fits + 1), *CAP),
        "check-mistyped-function": ("check", *MISTYPED, "--batch-size", "8", *CAP),
        "check-missing-module": ("check", *MISSING, "--batch-size", "8", *CAP),
    }


def _run(args: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if key != "BATCHFIT_DEBUG"}
    env["OMP_NUM_THREADS"] = "1"  # the runs share the machine's cores
    return subprocess.run(
        [sys.executable, "-m", "batchfit", *args],
        cwd=TESTS,  # workloads_for_cli is importable from here
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.fixture(scope="module")
def fits() -> int:
    """The largest training batch of ``tiny`` under ``CAP``, as ``find`` answers it here."""
    result = batchfit.find_batch_size(tiny(), device="cpu", memory_limit="256KiB")
    assert result.stop_reason == "boundary", result.summary()  # a real boundary to check around
    return result.batch_size


@pytest.fixture(scope="module")
def done(fits: int) -> dict[str, subprocess.CompletedProcess[str]]:
    runs = _runs(fits)
    with ThreadPoolExecutor(max_workers=max(2, min(8, os.cpu_count() or 2))) as pool:
        futures = {name: pool.submit(_run, args) for name, args in runs.items()}
        return {name: future.result() for name, future in futures.items()}


def _one_error(process: subprocess.CompletedProcess[str], message: str) -> None:
    """Nothing on stdout; on stderr the one error line and the hint, after any trial lines."""
    assert process.stdout == ""
    lines = process.stderr.splitlines()
    assert lines[-2:] == [message, HINT], process.stderr


def test_check_exits_0_when_it_fits_and_1_when_it_does_not(
    done: dict[str, subprocess.CompletedProcess[str]], fits: int
) -> None:
    passed, failed = done["check-fits"], done["check-does-not-fit"]
    assert passed.returncode == 0, passed.stderr
    assert passed.stdout.startswith(f"train: batch_size={fits} fits: peak ")
    assert failed.returncode == 1, failed.stderr
    assert failed.stdout.startswith(f"train: batch_size={fits + 1} does not fit a 204.80 KiB budget")
    assert "batchfit: error:" not in failed.stderr  # an answer, not an error


def test_check_exits_2_for_a_mistyped_or_missing_workload(
    done: dict[str, subprocess.CompletedProcess[str]],
) -> None:
    mistyped, missing = done["check-mistyped-function"], done["check-missing-module"]
    assert (mistyped.returncode, missing.returncode) == (2, 2)
    _one_error(mistyped, MISTYPED_ERROR)
    _one_error(missing, MISSING_ERROR)


@pytest.mark.parametrize("command", sorted(USAGE_ERRORS))
def test_every_subcommand_exits_2_on_a_usage_error(
    command: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # main itself, in this process (what `python -m batchfit` exits with): the table, cheaply.
    monkeypatch.delenv("BATCHFIT_DEBUG", raising=False)
    monkeypatch.chdir(TESTS)
    monkeypatch.setattr(sys, "path", list(sys.path))  # load_workload adds the working directory
    args, message = USAGE_ERRORS[command]
    assert main(list(args)) == 2
    captured = capsys.readouterr()
    assert (captured.out, captured.err) == ("", f"{message}\n{HINT}\n")


@pytest.mark.slow
@pytest.mark.parametrize("command", sorted(USAGE_ERRORS))
def test_every_subcommand_exits_2_on_a_usage_error_in_its_own_process(command: str) -> None:
    args, message = USAGE_ERRORS[command]
    process = _run(args)
    assert process.returncode == 2, process.stderr
    assert (process.stdout, process.stderr) == ("", f"{message}\n{HINT}\n")


@pytest.mark.parametrize("command", sorted(USAGE_ERRORS))
def test_every_subcommand_exits_2_on_an_unknown_flag_and_its_help_says_the_codes(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # argparse's own usage errors, in this process: main raises SystemExit(2), as `python -m` exits.
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--no-such-flag"])
    assert exit_info.value.code == 2
    said = capsys.readouterr().err
    assert said.startswith(f"usage: batchfit {command} ") and f"batchfit {command}: error: " in said
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    shown = " ".join(capsys.readouterr().out.split())
    assert "exit status: 0 ok; 1 " in shown
    assert (
        "2 a usage or configuration error: a bad flag or value, a --workload that cannot be imported or "
        "found, a device that is not there. Set BATCHFIT_DEBUG=1 to see the traceback."
    ) in shown
    if command == "check":
        assert "exit status: 0 ok; 1 a batch size does not fit, or the run failed" in shown


def test_an_ambiguous_memory_limit_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("BATCHFIT_DEBUG", raising=False)
    assert (
        main(["check", "--example", "mlp", "--batch-size", "8", "--device", "cpu", "--memory-limit", "64M"])
        == 2
    )
    assert capsys.readouterr().err == (
        "batchfit: error: memory_limit='64M' is ambiguous: write 64MB for 64,000,000 bytes (decimal) or "
        f"64MiB for 67,108,864 bytes (binary).\n{HINT}\n"
    )


def test_a_workload_module_whose_import_raises_is_a_configuration_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("BATCHFIT_DEBUG", raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # load_workload adds the working directory
    (tmp_path / "broken_train_for_batchfit.py").write_text("import torch\nmodel = undefined_name\n")
    args = ["check", "--workload", "broken_train_for_batchfit:workload", "--batch-size", "8"]
    assert main(args) == 2
    assert capsys.readouterr().err == (
        "batchfit: error: --workload 'broken_train_for_batchfit:workload': importing "
        "'broken_train_for_batchfit' raised NameError: name 'undefined_name' is not defined (at "
        f"{tmp_path / 'broken_train_for_batchfit.py'}:2); fix the module so that `python -c 'import "
        f"broken_train_for_batchfit'` runs.\n{HINT}\n"
    )

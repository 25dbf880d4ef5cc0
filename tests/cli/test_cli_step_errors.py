"""What the command line shows when the user's own step fails, diverges or is interrupted, run for
real (``python -m batchfit find --workload failing_steps:FUNCTION``): the user's frames and the
batch size and step, one clean message, or "interrupted"."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import batchfit
from batchfit.runtime.steps.finite import WHAT_TO_CHECK

TESTS = Path(__file__).resolve().parent
PACKAGE = str(Path(batchfit.__file__).resolve().parent)
FIND = ("find", "--device", "cpu", "--memory-limit", "1MiB", "--modes", "train")


def _env(**extra: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key != "BATCHFIT_DEBUG"}
    env["OMP_NUM_THREADS"] = "1"  # the runs share the machine's cores
    return {**env, **extra}


def _find(workload: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "batchfit", *FIND, "--workload", f"failing_steps:{workload}", *args]
    return subprocess.run(command, cwd=TESTS, env=_env(**env), capture_output=True, text=True, timeout=300)


#: A frame of the traceback, with its source line and the carets under it.
FRAME = r'  File "[^"]+", line \d+, in \w+\n(?:    .*\n)*'


def test_a_user_s_error_shows_the_user_s_frames_and_the_batch_and_step() -> None:
    run = _find("shape_mismatch")
    own_frame = (
        rf'  File "{re.escape(str(TESTS / "failing_steps.py"))}", line \d+, in mismatched_loss\n'
        r"    return nn\.functional\.cross_entropy\(output, half\)\n"
        r"           \^+\n"
    )
    expected = (
        r"Traceback \(most recent call last\):\n"
        + own_frame
        + rf"(?:{FRAME})+"  # torch's cross_entropy, which raised
        + re.escape(
            "ValueError: Expected input batch_size (2) to match target batch_size (1).\n"
            "batchfit: raised by the train step at batch_size=2, step 1 of 2.\n"
            "(batchfit's own frames are left out; set BATCHFIT_DEBUG=1 to see them)\n"
        )
    )
    assert re.fullmatch(expected, run.stderr), run.stderr
    assert PACKAGE not in run.stderr  # none of batchfit's frames
    assert (run.returncode, run.stdout) == (1, "")


def test_under_batchfit_debug_the_traceback_goes_through_batchfit() -> None:
    run = _find("shape_mismatch", BATCHFIT_DEBUG="1")
    assert run.returncode == 1
    assert f'{PACKAGE}/runtime/steps/runner.py", line' in run.stderr
    assert f'{TESTS / "failing_steps.py"}", line' in run.stderr
    assert run.stderr.endswith(
        "ValueError: Expected input batch_size (2) to match target batch_size (1).\n"
        "batchfit: raised by the train step at batch_size=2, step 1 of 2.\n"
    )


def test_a_nan_loss_is_one_clean_message() -> None:
    run = _find("nan_loss", "--min-batch-size", "16", "--max-batch-size", "16")
    assert run.stderr == (
        "batchfit: error: the train step's loss is nan at batch_size=16, step 1 of 2; batchfit does not "
        f"answer from steps that do not train. {WHAT_TO_CHECK}\n(set BATCHFIT_DEBUG=1 to see the traceback)\n"
    )
    assert (run.returncode, run.stdout) == (1, "")


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_in_a_step_says_interrupted(tmp_path: Path) -> None:
    mark = tmp_path / "in-the-step"
    command = [sys.executable, "-m", "batchfit", *FIND, "--workload", "failing_steps:slow_step"]
    process = subprocess.Popen(
        command,
        cwd=TESTS,
        env=_env(BATCHFIT_TEST_MARK=str(mark)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # Ctrl-C as a terminal delivers it: a suite started in the background of a shell without job
        # control runs with SIGINT ignored, which its children inherit (Python then never raises it).
        preexec_fn=_default_sigint,
    )
    try:
        deadline = time.monotonic() + 120
        while not mark.exists() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert mark.exists(), "the step never started"
        process.send_signal(signal.SIGINT)  # as Ctrl-C in a terminal does
        stdout, stderr = process.communicate(timeout=60)
    finally:
        process.kill()
    assert (process.returncode, stdout) == (130, "")
    assert stderr.endswith("batchfit: interrupted; the model and optimizer were left as they were.\n")
    assert "raised by" not in stderr and "Traceback" not in stderr

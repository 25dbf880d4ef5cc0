"""The live progress line: drawn under the trial lines when stderr is a terminal (a real
pseudo-terminal here), absent when it is not, and gone, with the cursor back, however the command ends.

The runs are real ``python -m batchfit`` processes, started side by side once per module by the
``runs`` fixture; the tests read what they wrote.
"""

from __future__ import annotations

import fcntl
import itertools
import json
import os
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from batchfit.cli.progress import Display, StatusLine, trial_line
from batchfit.policy.explore.choose import Recommendation
from batchfit.policy.search.trial import Trial

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "src")
COLUMNS = 200  # wide enough that no live line is cut short
TIMEOUT_SECONDS = 120
ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
HIDE_CURSOR, SHOW_CURSOR, CLEAR_LINE = "\x1b[?25l", "\x1b[?25h", "\x1b[2K"
#: The live line: a spinner, the status, the elapsed time at the right end.
FRAME = re.compile(r"^[-\\|/] (?P<status>.*?) +(?P<elapsed>\d:\d\d:\d\d)$")
TRIAL = re.compile(r"^batchfit: (train|eval) +batch_size=(\d+) +(ok|oom|over_budget) +peak ")
MLP_48 = ("--example", "mlp", "--device", "cpu", "--memory-limit", "48MiB")
#: Under torchrun the example comes in DDP, whose gradient buckets (7 MiB) 48 MiB cannot also hold.
MLP_56 = ("--example", "mlp", "--device", "cpu", "--memory-limit", "56MiB")


@dataclass(frozen=True)
class Run:
    args: tuple[str, ...]
    terminal: bool = True  # stderr on a pseudo-terminal, else a pipe
    term: str = "xterm-256color"
    interrupt_on: str | None = None  # SIGINT once the terminal shows this text
    ranks: int = 1  # more: under torchrun, on one terminal


@dataclass(frozen=True)
class Done:
    returncode: int
    stdout: str
    stderr: str  # as written, escape sequences and all (the pty's line ends made \n again)

    @property
    def frames(self) -> list[str]:
        """The statuses the live line showed, one per redraw, without the spinner and the time."""
        found = [FRAME.match(piece) for piece in re.split(r"[\r\n]", ESCAPE.sub("", self.stderr))]
        return [frame["status"] for frame in found if frame is not None]

    @property
    def lines(self) -> list[str]:
        """The lines printed above the live line (or alone, off a terminal)."""
        ends = [line.rpartition("\r")[2] for line in ESCAPE.sub("", self.stderr).split("\n")]
        return [line for line in ends if line.startswith("batchfit: ")]


RUNS: dict[str, Run] = {
    "find-terminal": Run(("find", *MLP_48, "--format", "json")),
    "find-pipe": Run(("find", *MLP_48, "--format", "json"), terminal=False),
    "find-dumb-terminal": Run(("find", *MLP_48, "--format", "json"), term="dumb"),
    "find-error": Run(("find", "--example", "mlp", "--device", "cpu", "--memory-limit", "1MiB")),
    "explore": Run(("explore", *MLP_48, "--max-batch-size", "128", "--time-budget-seconds", "1")),
    "explore-interrupted": Run(
        ("explore", *MLP_48, "--time-budget-seconds", "60", "--confidence-target", "100"),
        interrupt_on="micro_batch_size=",  # the first recommendation, settled or a leaning
    ),
    "torchrun": Run(("find", *MLP_56, "--modes", "train", "--max-batch-size", "64"), ranks=2),
    "torchrun-all-ranks": Run(
        ("find", *MLP_56, "--modes", "train", "--max-batch-size", "64", "--all-ranks"), ranks=2
    ),
}


def environment(term: str) -> dict[str, str]:
    """This checkout's batchfit, and none of the variables that make rich call a pipe a terminal."""
    forcing = ("FORCE_COLOR", "FORCE_TERMINAL", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "NO_COLOR")
    env = {key: value for key, value in os.environ.items() if key not in (*forcing, "COLUMNS", "LINES")}
    env.update(PYTHONPATH=SRC, TERM=term, OMP_NUM_THREADS="1")
    env.pop("BATCHFIT_DEBUG", None)
    return env


def execute(run: Run, cwd: str) -> Done:
    launcher = (
        ()
        if run.ranks == 1
        else ("-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={run.ranks}")
    )
    command = [sys.executable, *launcher, "-m", "batchfit", *run.args]
    if not run.terminal:
        piped = subprocess.run(
            command,
            cwd=cwd,
            env=environment(run.term),
            capture_output=True,
            text=True,
            timeout=TIMEOUT_SECONDS,
        )
        return Done(piped.returncode, piped.stdout, piped.stderr)
    main, terminal = os.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 40, COLUMNS, 0, 0))
    process = subprocess.Popen(
        command,
        cwd=cwd,
        env=environment(run.term),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=terminal,
    )
    os.close(terminal)  # the child holds it: reading ends when the child exits
    written, interrupted, deadline = b"", False, time.monotonic() + TIMEOUT_SECONDS
    try:
        while time.monotonic() < deadline:
            if not select.select([main], [], [], 1.0)[0]:
                continue
            try:
                chunk = os.read(main, 65536)
            except OSError:  # EIO: the terminal's last holder is gone
                break
            if not chunk:
                break
            written += chunk
            if run.interrupt_on and not interrupted and run.interrupt_on.encode() in written:
                process.send_signal(signal.SIGINT)
                interrupted = True
        else:
            process.kill()
        assert process.stdout is not None
        stdout = process.stdout.read().decode()
        process.wait(timeout=TIMEOUT_SECONDS)
    finally:
        os.close(main)
        if process.poll() is None:
            process.kill()
    return Done(process.returncode, stdout, written.decode().replace("\r\n", "\n"))


@contextmanager
def interruptible_children() -> Iterator[None]:
    """Children that Ctrl-C interrupts, however these tests were started. A shell starts a
    background job (``bash .ci/run &``) with SIGINT ignored, and an ignored signal stays ignored
    across exec: the child's Python would then install no KeyboardInterrupt handler. A handler
    set here is reset to the default in each child at exec, where Python installs its own."""
    ignored = signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    if ignored:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        if ignored:
            signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Done]:
    with interruptible_children(), ThreadPoolExecutor(max_workers=len(RUNS)) as pool:
        futures = {
            name: pool.submit(execute, run, str(tmp_path_factory.mktemp(name))) for name, run in RUNS.items()
        }
        return {name: future.result() for name, future in futures.items()}


def trials_of(document: dict[str, object]) -> list[tuple[str, int, str]]:
    results = document["results"]
    assert isinstance(results, list)
    return [(r["mode"], t["batch_size"], t["outcome"]) for r in results for t in r["trials"]]


def expected_statuses(trials: list[tuple[str, int, str]]) -> list[str]:
    """What find's live line says, change by change, around these trials."""
    statuses = ["find: running"]
    for number, (mode, batch_size, outcome) in enumerate(trials, start=1):
        before = ""
        if number > 1:
            last_mode, last_batch_size, last_outcome = trials[number - 2]
            label = f"{last_mode} " if last_mode != mode else ""
            before = f"; {counted(number - 1)}, last {label}batch_size={last_batch_size} {last_outcome}"
        statuses.append(f"find {mode}: batch_size={batch_size} running{before}")
        statuses.append(f"find {mode}: running; {counted(number)}, last batch_size={batch_size} {outcome}")
    return statuses


def counted(number: int) -> str:
    return f"{number} trial{'s' if number > 1 else ''}"


def trial_lines(done: Done) -> list[tuple[str, int, str]]:
    found = [TRIAL.match(line) for line in done.lines]
    return [(m[1], int(m[2]), m[3]) for m in found if m is not None]


def test_find_on_a_terminal_draws_the_live_line_under_the_trial_lines(runs: dict[str, Done]) -> None:
    done = runs["find-terminal"]
    assert done.returncode == 0, done.stderr
    trials = trials_of(json.loads(done.stdout))  # the answer is on stdout, alone
    assert trial_lines(done) == trials
    # The lines above the live line are the piped run's: the trials, then one summary per mode.
    assert len(done.lines) == len(trials) + 2
    assert HIDE_CURSOR in done.stderr and CLEAR_LINE in done.stderr
    # The live line showed each candidate while it ran, and after it the count and its outcome.
    assert [status for status, _ in itertools.groupby(done.frames)] == expected_statuses(trials)
    # It ends cleared, with the cursor shown again.
    assert done.stderr.rindex(SHOW_CURSOR) > done.stderr.rindex(HIDE_CURSOR)
    assert done.stderr.endswith(f"{SHOW_CURSOR}\r\x1b[1A{CLEAR_LINE}")


def test_find_piped_prints_one_line_per_trial_and_no_escape_sequences(runs: dict[str, Done]) -> None:
    for name in ("find-pipe", "find-dumb-terminal"):
        done = runs[name]
        assert done.returncode == 0, done.stderr
        assert "\x1b" not in done.stderr and "\r" not in done.stderr, name
        trials = trials_of(json.loads(done.stdout))
        assert trial_lines(done) == trials, name
        assert done.stderr.splitlines() == done.lines  # nothing but the lines
        assert len(done.lines) == len(trials) + 2, name
    # The same search as on the terminal.
    assert trial_lines(runs["find-pipe"]) == trial_lines(runs["find-terminal"])


def test_an_error_clears_the_live_line_before_its_one_message(runs: dict[str, Done]) -> None:
    done = runs["find-error"]
    assert done.returncode == 1
    assert HIDE_CURSOR in done.stderr
    cleared = done.stderr.rindex(SHOW_CURSOR)
    after = ESCAPE.sub("", done.stderr[cleared:]).lstrip("\r").splitlines()
    assert after[0].startswith("batchfit: error: the train step does not fit even at batch_size=1 on cpu")
    assert after[1:] == ["(set BATCHFIT_DEBUG=1 to see the traceback)"]
    assert any("find train: running; 2 trials, last batch_size=1 oom" in frame for frame in done.frames)


def test_explore_on_a_terminal_shows_the_recommendation_and_its_confidence(runs: dict[str, Done]) -> None:
    done = runs["explore"]
    assert done.returncode == 0, done.stderr
    # With 1 s, a leaning rather than an answer (under the confidence floor): the line says which.
    said = [line for line in done.lines if "estimated performance:" in line and "; measured " not in line]
    assert said  # the lines stay as they are
    last = re.search(
        r"(Current recommended micro_batch_size: |No micro_batch_size settled: leaning to )(\d+), estimated "
        r"performance: (\S+)x base.*, confidence score: (\d+)",
        said[-1],
    )
    assert last is not None
    head, batch, speedup, confidence = last.groups()
    recommended = f"micro_batch_size={batch} ({speedup}x base), confidence {confidence}/100"
    if head.startswith("Current"):
        recommended = f"recommended {recommended}"
    else:
        recommended = f"leaning to {recommended}, not settled"
    shown = f"explore: running; {recommended}"
    assert shown in done.frames, (shown, done.frames)
    assert done.frames[0] == "explore: running"
    assert done.stdout.startswith("batch_size")  # the table, on stdout
    assert done.stderr.rindex(SHOW_CURSOR) > done.stderr.rindex(HIDE_CURSOR)


def test_ctrl_c_clears_the_live_line_and_shows_the_cursor(runs: dict[str, Done]) -> None:
    done = runs["explore-interrupted"]
    assert done.returncode == 130
    assert done.stdout == ""
    cleared = done.stderr.rindex(SHOW_CURSOR)
    assert cleared > done.stderr.rindex(HIDE_CURSOR)
    assert ESCAPE.sub("", done.stderr[cleared:]).lstrip("\r") == (
        "batchfit: interrupted; the model and optimizer were left as they were.\n"
    )


@pytest.mark.distributed
def test_under_torchrun_rank_0_alone_draws_the_live_line(runs: dict[str, Done]) -> None:
    done = runs["torchrun"]
    assert done.returncode == 0, done.stderr
    assert done.stderr.count(HIDE_CURSOR) == done.stderr.count(SHOW_CURSOR) == 1
    assert "find train: running; 1 trial, last batch_size=64 ok" in done.frames
    assert len(trial_lines(done)) == 1


@pytest.mark.distributed
def test_under_torchrun_with_all_ranks_no_rank_draws_it(runs: dict[str, Done]) -> None:
    done = runs["torchrun-all-ranks"]
    assert done.returncode == 0, done.stderr
    assert "\x1b" not in done.stderr and not done.frames
    # Each rank prints its own lines (two ranks' lines may interleave on one terminal).
    assert done.stderr.count("batchfit: train batch_size=64     ok") == 2


# -- the text, without a terminal ------------------------------------------------------------------

RECOMMENDATION = Recommendation(
    batch_size=64, best_batch_size=128, base_batch_size=8, speedup=1.85, confidence=72
)


@pytest.mark.parametrize(
    ("status", "text"),
    [
        (StatusLine("find"), "find: running"),
        (StatusLine("find").started("train", 433), "find train: batch_size=433 running"),
        (
            StatusLine("find").started("train", 433).finished("train", "batch_size=433 oom"),
            "find train: running; 1 trial, last batch_size=433 oom",
        ),
        (
            StatusLine("find")
            .finished("train", "batch_size=432 ok")
            .finished("train", "batch_size=433 oom")
            .started("eval", 1024),
            "find eval: batch_size=1024 running; 2 trials, last train batch_size=433 oom",
        ),
        (
            StatusLine("explore").recommended(RECOMMENDATION),
            "explore: running; recommended micro_batch_size=64 (1.85x base), confidence 72/100",
        ),
        (
            StatusLine("compare").finished("amp", "batch_size=96 ok").recommended(RECOMMENDATION),
            (
                "compare amp: running; 1 trial, last batch_size=96 ok; "
                "recommended micro_batch_size=64 (1.85x base), confidence 72/100"
            ),
        ),
        (
            StatusLine("explore").recommended(Recommendation(140, 140, 140, 1.0, 0)),
            "explore: running; leaning to micro_batch_size=140 (1.00x base), confidence 0/100, not settled",
        ),
        (StatusLine("advise").started("explore"), "advise explore: running"),
        (
            StatusLine("check-data", noun="settings")
            .finished("", "a")
            .finished("", "num_workers=2: 812.5 samples/s"),
            "check-data: running; 2 settings, last num_workers=2: 812.5 samples/s",
        ),
    ],
)
def test_status_text(status: StatusLine, text: str) -> None:
    assert status.text() == text


def test_trial_line() -> None:
    ok = Trial(512, "ok", peak_bytes=39_823_360, step_seconds=0.3639, steps=10)
    assert trial_line("train", ok, usual_steps=2) == (
        "batchfit: train batch_size=512    ok          peak   37.98 MiB  10 steps     363.9 ms/step"
    )
    failed = Trial(2, "oom", peak_bytes=0, step_seconds=None)
    assert trial_line("eval", failed) == "batchfit: eval  batch_size=2      oom         peak           -"
    late = Trial(640, "oom", peak_bytes=39_823_360, step_seconds=None, steps=10, failed_at_step=3)
    assert trial_line("train", late, usual_steps=2) == (
        "batchfit: train batch_size=640    oom         peak   37.98 MiB  out at step 3 of 10"
    )
    warm_up = Trial(4, "oom", peak_bytes=0, step_seconds=None, steps=2, failed_at_step=0)
    assert trial_line("eval", warm_up).endswith("peak           -  out in the warm-up step")


def test_off_a_terminal_the_display_prints_the_trial_lines_alone(capsys: pytest.CaptureFixture[str]) -> None:
    trial = Trial(921, "ok", peak_bytes=40_255_488, step_seconds=0.0999)
    with Display("find") as display:
        assert not display.live
        display.start("eval", 921)
        display.trial("eval", trial)
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == trial_line("eval", trial) + "\n"
    assert display.status.text() == "find eval: running; 1 trial, last batch_size=921 ok"


#: A Ctrl-C between a line's text and its newline, as the traceback of a KeyboardInterrupt raised
#: inside rich's stderr proxy leaves it: the text buffered in the proxy, and the proxy kept alive
#: past the interrupted message (here by ``proxy``, as by the traceback's frames).
CUT_LINE = """
import sys
from batchfit.cli.progress import Display
try:
    with Display("explore"):
        proxy = sys.stderr
        proxy.write("batchfit: a line cut short")
        raise KeyboardInterrupt
except KeyboardInterrupt:
    print("batchfit: interrupted", file=sys.stderr)
del proxy
"""


def test_a_line_cut_short_by_ctrl_c_is_written_before_the_interrupted_message(tmp_path: Path) -> None:
    main, terminal = os.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 40, COLUMNS, 0, 0))
    command = [sys.executable, "-c", CUT_LINE]
    env = environment("xterm-256color")
    process = subprocess.Popen(command, cwd=tmp_path, env=env, stdin=subprocess.DEVNULL, stderr=terminal)
    os.close(terminal)
    written = b""
    try:
        while select.select([main], [], [], TIMEOUT_SECONDS)[0]:
            try:
                chunk = os.read(main, 65536)
            except OSError:  # EIO: the child is gone
                break
            if not chunk:
                break
            written += chunk
        assert process.wait(timeout=TIMEOUT_SECONDS) == 0
    finally:
        os.close(main)
    stderr = ESCAPE.sub("", written.decode()).replace("\r", "")
    assert stderr.index("batchfit: a line cut short") < stderr.index("batchfit: interrupted")
    assert stderr.rstrip("\n").endswith("batchfit: interrupted")

"""What long commands say on stderr while they work: one line per trial, and, when stderr is a
terminal, a live line under them (rich) with what runs now, the trials so far, explore's
recommendation and its confidence, and the elapsed time."""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from types import TracebackType

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Column

from batchfit.policy.choose import Recommendation
from batchfit.policy.trial import Trial
from batchfit.units import format_bytes


@dataclass(frozen=True)
class Status:
    """The live line's text: the command, the label (mode, technique or step) and the candidate
    running now, what is done so far and the last of it, and explore's recommendation."""

    command: str
    label: str = ""
    batch_size: int | None = None  # the candidate running now
    done: int = 0
    noun: str = "trials"  # what ``done`` counts
    last_label: str = ""
    last: str = ""  # the outcome of the last one done
    recommendation: Recommendation | None = None

    def text(self) -> str:
        now = "running" if self.batch_size is None else f"batch_size={self.batch_size} running"
        head = f"{self.command} {self.label}" if self.label else self.command
        words = [f"{head}: {now}"]
        if self.done:
            label = f"{self.last_label} " if self.last_label and self.last_label != self.label else ""
            noun = self.noun if self.done > 1 else self.noun.removesuffix("s")
            words.append(f"{self.done} {noun}, last {label}{self.last}")
        if self.recommendation is not None:
            recommended = self.recommendation
            words.append(
                f"recommended micro_batch_size={recommended.batch_size} "
                f"({recommended.speedup:.2f}x base), confidence {recommended.confidence}/100"
            )
        return "; ".join(words)

    def started(self, label: str, batch_size: int | None = None) -> Status:
        return replace(self, label=label, batch_size=batch_size)

    def finished(self, label: str, outcome: str) -> Status:
        return replace(self, label=label, batch_size=None, done=self.done + 1, last_label=label, last=outcome)

    def recommended(self, recommendation: Recommendation) -> Status:
        return replace(self, recommendation=recommendation)


def trial_line(label: str, trial: Trial, usual_steps: int | None = None) -> str:
    """A trial's line: its label, batch, outcome and peak; the step that ran out of memory, or the
    steps when unusual; the step time, and on a GPU what the allocator reserved and its retries."""
    peak = format_bytes(trial.peak_bytes) if trial.peak_bytes else "-"  # 0: failed before a step
    extras = []
    if trial.failed_at_step is not None and trial.steps is not None:
        step = trial.failed_at_step
        extras.append(f"out at step {step} of {trial.steps}" if step else "out in the warm-up step")
    elif trial.steps is not None and usual_steps is not None and trial.steps != usual_steps:
        repeated = f" (state of step {trial.steady_from} repeated)" if trial.steady_from is not None else ""
        extras.append(f"{trial.steps} steps{repeated}")
    if trial.step_seconds is not None:
        extras.append(f"{trial.step_seconds * 1000:8.1f} ms/step")
    if trial.reserved_peak_bytes is not None:
        extras.append(f"reserved {format_bytes(trial.reserved_peak_bytes)}")
    if trial.allocator_retries:
        extras.append(f"{trial.allocator_retries} allocator retries")
    return (
        f"batchfit: {label:<5} batch_size={trial.batch_size:<6} {trial.outcome:<11} "
        f"peak {peak:>11}{''.join('  ' + extra for extra in extras)}"
    )


class Display:
    """The live line, for a ``with`` block around a command's work: drawn on stderr when it is a
    terminal (a real one, as rich judges it: not TERM=dumb, not TTY_INTERACTIVE=0), and only while
    the block runs; it is cleared on the way out, by success, error or Ctrl-C alike. While it is
    drawn, whatever is printed to stderr goes above it, unchanged. ``live=False`` keeps it off
    (several ranks printing to one terminal)."""

    def __init__(self, command: str, *, noun: str = "trials", live: bool = True) -> None:
        self.status = Status(command, noun=noun)
        # soft_wrap: the lines printed above the live line reach the terminal as they are, unwrapped.
        console = Console(stderr=True, soft_wrap=True)
        self.live = live and sys.stderr.isatty() and console.is_interactive
        self._progress = Progress(
            SpinnerColumn("line"),
            TextColumn(
                "{task.description}",
                markup=False,
                table_column=Column(ratio=1, no_wrap=True, overflow="ellipsis"),  # what the width leaves
            ),
            TimeElapsedColumn(),
            console=console,
            transient=True,
            expand=True,
            refresh_per_second=4,  # the spinner and the seconds; light beside the steps being timed
            redirect_stdout=False,  # stdout is the result's; it is written after the display stops
            disable=not self.live,
        )
        self._task = self._progress.add_task(self.status.text(), total=None)

    def __enter__(self) -> Display:
        self._progress.start()
        return self

    def __exit__(
        self,
        error_type: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._progress.stop()

    def start(self, label: str, batch_size: int | None = None) -> None:
        """``label`` runs now, at ``batch_size`` when it is a trial."""
        self._show(self.status.started(label, batch_size))

    def trial(self, label: str, trial: Trial, usual_steps: int | None = None) -> None:
        """A trial finished: its line, and one more trial on the live line."""
        self._show(self.status.finished(label, f"batch_size={trial.batch_size} {trial.outcome}"))
        print(trial_line(label, trial, usual_steps), file=sys.stderr, flush=True)

    def finish(self, label: str, outcome: str) -> None:
        """One more done (a setting measured, say) whose line the command printed."""
        self._show(self.status.finished(label, outcome))

    def recommend(self, recommendation: Recommendation) -> None:
        self._show(self.status.recommended(recommendation))

    def _show(self, status: Status) -> None:
        self.status = status
        self._progress.update(self._task, description=status.text(), refresh=True)

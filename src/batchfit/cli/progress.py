"""What long commands say on stderr while they work: one line per trial, and, when stderr is a
terminal, a live line under them (rich) with what runs now, the trials so far, explore's
recommendation and its confidence, and the elapsed time."""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from types import TracebackType

from rich.console import Console
from rich.file_proxy import FileProxy
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Column

from batchfit import Event
from batchfit.policy.explore.choose import Recommendation
from batchfit.policy.search.trial import Trial


@dataclass(frozen=True)
class StatusLine:
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
            verb = "recommended" if recommended.settled else "leaning to"
            words.append(
                f"{verb} micro_batch_size={recommended.batch_size} "
                f"({recommended.speedup:.2f}x base), confidence {recommended.confidence}/100"
                + ("" if recommended.settled else ", not settled")
            )
        return "; ".join(words)

    def started(self, label: str, batch_size: int | None = None) -> StatusLine:
        return replace(self, label=label, batch_size=batch_size)

    def finished(self, label: str, outcome: str) -> StatusLine:
        return replace(self, label=label, batch_size=None, done=self.done + 1, last_label=label, last=outcome)

    def recommended(self, recommendation: Recommendation) -> StatusLine:
        return replace(self, recommendation=recommendation)


def trial_line(label: str, trial: Trial, usual_steps: int | None = None) -> str:
    """A trial's line on stderr (``Trial.line``)."""
    return f"batchfit: {trial.line(label, usual_steps)}"


class Display:
    """The live line, for a ``with`` block around a command's work: drawn on stderr when it is a
    terminal (a real one, as rich judges it: not TERM=dumb, not TTY_INTERACTIVE=0), and only while
    the block runs; it is cleared on the way out, by success, error or Ctrl-C alike. While it is
    drawn, whatever is printed to stderr goes above it, unchanged. ``live=False`` keeps it off
    (several ranks printing to one terminal)."""

    def __init__(
        self, command: str, *, noun: str = "trials", live: bool = True, usual_steps: int | None = None
    ) -> None:
        self.status = StatusLine(command, noun=noun)
        self.usual_steps = usual_steps  # a trial of other steps says how many it ran
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
        # A Ctrl-C between a line's text and its newline leaves the text in rich's stderr proxy,
        # which the traceback keeps alive and which prints it when collected: after the
        # interrupted message. Flushed here, it goes above the live line, before the line clears.
        if isinstance(sys.stderr, FileProxy):
            sys.stderr.flush()
        self._progress.stop()

    def start(self, label: str, batch_size: int | None = None) -> None:
        """``label`` runs now, at ``batch_size`` when it is a trial."""
        self._show(self.status.started(label, batch_size))

    def hear(self, event: Event) -> None:
        """A verb's progress: a trial's line, a step or a setting, a recommendation or a note,
        printed and shown on the live line."""
        if event.stage == "started":
            if event.batch_size is None:  # a step of advise, not a trial
                _say(f"{event.verb}: {event.label}...")
            self.start(event.label, event.batch_size)
        elif event.stage == "trial" and event.trial is not None:
            self.trial(event.label, event.trial)
        elif event.stage == "recommendation" and event.recommendation is not None:
            self.recommend(event.recommendation)
            _say(event.recommendation.line())
        elif event.stage == "setting":
            self.finish(event.label, event.message)
            _say(event.message)
        elif event.stage == "note":
            _say(f"note: {event.message}")
        else:
            _say(event.message)

    def trial(self, label: str, trial: Trial) -> None:
        """A trial finished: its line, and one more trial on the live line."""
        self._show(self.status.finished(label, f"batch_size={trial.batch_size} {trial.outcome}"))
        print(trial_line(label, trial, self.usual_steps), file=sys.stderr, flush=True)

    def finish(self, label: str, outcome: str) -> None:
        """One more done (a setting measured, say) whose line the command printed."""
        self._show(self.status.finished(label, outcome))

    def recommend(self, recommendation: Recommendation) -> None:
        self._show(self.status.recommended(recommendation))

    def _show(self, status: StatusLine) -> None:
        self.status = status
        self._progress.update(self._task, description=status.text(), refresh=True)


def _say(text: str) -> None:
    print(f"batchfit: {text}", file=sys.stderr, flush=True)

"""What the real trials of a search from a saved prediction were for, in a line: the prediction's
answer and the size above the answer are what a right prediction costs; any trial more is named
with why it was needed (the prediction failed on the device, or fell short of it)."""

from __future__ import annotations

from collections.abc import Sequence

from batchfit.policy.search.trial import Trial
from batchfit.units import format_count


def trials_account(trials: Sequence[Trial], batch_size: int | None, started_from: int | None) -> str:
    """``trials`` (in the order they ran) of a search whose first trial was at ``started_from`` (a
    saved prediction's answer) and whose answer is ``batch_size``: each trial's size and outcome,
    then why any beyond the answer's own and the size above it ran. Empty without ``started_from``."""
    if started_from is None or not trials:
        return ""
    above = [
        t.batch_size for t in trials if not t.fits and batch_size is not None and t.batch_size > batch_size
    ]
    next_size = min(above, default=None)
    said = [_said(trial, index, batch_size, next_size, started_from) for index, trial in enumerate(trials)]
    needed = sum(1 for t in trials if t.batch_size in (batch_size, next_size))
    extra = len(trials) - max(needed, 1)
    line = f"{format_count(len(trials), 'real trial')}: {', '.join(said)}"
    if extra <= 0:
        return f"{line}."
    seed = trials[0]
    if seed.batch_size != started_from:
        why = "the prediction's answer was not among the candidates"
    elif not seed.fits:
        why = f"the prediction's {started_from} failed on the device"
    else:
        why = f"the prediction's {started_from} fell short of the device's answer"
    return f"{line}; {format_count(extra, 'trial')} more than a right prediction needs, as {why}."


def _said(trial: Trial, index: int, batch_size: int | None, next_size: int | None, started_from: int) -> str:
    """One trial in a few words: what it was, and how it ended."""
    size = trial.batch_size
    if index == 0 and size == started_from:
        name = f"the prediction's {size}"
    elif size == batch_size:
        name = f"the answer {size}"
    elif size == next_size:
        name = f"{size} above it"
    else:
        name = str(size)
    if not trial.fits:
        return f"{name} failed"
    return f"{name} fitted {trial.steps} steps" if trial.steps else f"{name} fitted"

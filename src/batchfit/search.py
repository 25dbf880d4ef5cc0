"""The search arithmetic, free of torch: the largest batch a ``run(batch) -> Trial`` oracle accepts.

It fits a memory model (fixed bytes + bytes per sample) to the trials it has, jumps to the
predicted boundary and confirms it: the answer was run and fitted, and the next larger candidate
was run and failed (or the upper bound was reached). Model-guided steps fall back to bisection
(galloping upwards while no failure is known) whenever they stop halving the interval, so the
trial count is never worse than a binary search's by more than a couple.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Literal

from batchfit.errors import ConfigurationError

Outcome = Literal["ok", "oom", "over_budget"]
StopReason = Literal["boundary", "max_batch", "min_batch_failed"]


@dataclass(frozen=True)
class Trial:
    """One measured attempt at a batch size."""

    batch_size: int
    outcome: Outcome
    peak_bytes: int  # the peak reached; for "oom", the peak before the failing allocation
    step_seconds: float | None  # seconds of the last (steady-state) step; None if it failed
    detail: str = ""  # why it failed, in a line

    @property
    def fits(self) -> bool:
        return self.outcome == "ok"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class MemoryModel:
    """Peak memory as ``fixed_bytes + bytes_per_sample * batch_size``, fitted to two trials."""

    fixed_bytes: float
    bytes_per_sample: float
    fitted_on: tuple[int, int]  # the two batch sizes the line goes through

    def predict_peak_bytes(self, batch_size: int) -> float:
        return self.fixed_bytes + self.bytes_per_sample * batch_size

    def max_batch_size(self, budget_bytes: int) -> int | None:
        """Largest batch whose predicted peak is within budget; None if the slope is not positive."""
        if self.bytes_per_sample <= 0:
            return None
        return math.floor((budget_bytes - self.fixed_bytes) / self.bytes_per_sample)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def through(cls, low: Trial, high: Trial) -> MemoryModel:
        slope = (high.peak_bytes - low.peak_bytes) / (high.batch_size - low.batch_size)
        return cls(low.peak_bytes - slope * low.batch_size, slope, (low.batch_size, high.batch_size))


@dataclass(frozen=True)
class Candidates:
    """The batch sizes allowed: multiples of ``multiple_of`` in [min_batch, max_batch]."""

    first: int
    step: int
    count: int

    @classmethod
    def between(cls, min_batch: int, max_batch: int, multiple_of: int | None = None) -> Candidates:
        for name, value in (("min_batch", min_batch), ("max_batch", max_batch)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigurationError(f"{name} must be a positive integer, got {value!r}.")
        if min_batch > max_batch:
            raise ConfigurationError(
                f"min_batch ({min_batch}) is larger than max_batch ({max_batch}); "
                f"pass min_batch <= max_batch."
            )
        step = 1 if multiple_of is None else multiple_of
        if isinstance(step, bool) or not isinstance(step, int) or step < 1:
            raise ConfigurationError(f"multiple_of must be a positive integer, got {multiple_of!r}.")
        first = -(-min_batch // step) * step
        last = max_batch // step * step
        if first > last:
            raise ConfigurationError(
                f"no multiple of {step} lies in [min_batch, max_batch] = [{min_batch}, {max_batch}]; "
                f"widen the range or change multiple_of."
            )
        return cls(first, step, (last - first) // step + 1)

    def batch(self, index: int) -> int:
        return self.first + index * self.step

    def index_at_most(self, batch_size: float) -> int:
        """Index of the largest candidate <= batch_size (-1 if none)."""
        return math.floor((batch_size - self.first) / self.step)


@dataclass(frozen=True)
class SearchOutcome:
    batch_size: int | None
    trials: tuple[Trial, ...]
    memory_model: MemoryModel | None
    stop_reason: StopReason


def search(run: Callable[[int], Trial], candidates: Candidates, budget_bytes: int) -> SearchOutcome:
    """Find the largest candidate batch that ``run`` reports as fitting ``budget_bytes``."""
    trials: list[Trial] = []
    at: dict[int, Trial] = {}

    def probe(index: int) -> Trial:
        trial = run(candidates.batch(index))
        trials.append(trial)
        at[index] = trial
        return trial

    if not probe(0).fits:
        return SearchOutcome(None, tuple(trials), None, "min_batch_failed")
    low, high = 0, None  # largest index known to fit, smallest index known to fail
    widths: list[int] = []
    model: MemoryModel | None = None
    while True:
        if high is None and low == candidates.count - 1:
            reason: StopReason = "max_batch"
            break
        if high is not None and high == low + 1:
            reason = "boundary"
            break
        model = _local_model(at, low, high) or model
        halving_stalled = len(widths) >= 3 and widths[-1] > widths[-3] / 2
        index = _next_index(candidates, budget_bytes, model, low, high, bisect=halving_stalled)
        if probe(index).fits:
            low = index
        else:
            high = index
        if high is not None:
            widths.append(high - low)
    return SearchOutcome(candidates.batch(low), tuple(trials), model, reason)


def _local_model(at: dict[int, Trial], low: int, high: int | None) -> MemoryModel | None:
    """A line through the two measured trials nearest the boundary (a failed one if its peak is whole)."""
    fitting = sorted(index for index, trial in at.items() if trial.fits)
    upper = at.get(high) if high is not None else None
    if upper is not None and upper.outcome == "over_budget":
        return MemoryModel.through(at[low], upper)
    if len(fitting) >= 2:
        return MemoryModel.through(at[fitting[-2]], at[fitting[-1]])
    return None


def _next_index(
    candidates: Candidates,
    budget_bytes: int,
    model: MemoryModel | None,
    low: int,
    high: int | None,
    *,
    bisect: bool,
) -> int:
    upper = candidates.count - 1 if high is None else high - 1
    predicted = None if model is None else model.max_batch_size(budget_bytes)
    if bisect and high is not None:
        index = (low + high) // 2
    elif predicted is not None:
        index = candidates.index_at_most(predicted)
    else:  # nothing to extrapolate from yet: gallop (double the batch)
        index = candidates.index_at_most(2 * candidates.batch(low))
    return min(max(index, low + 1), upper)

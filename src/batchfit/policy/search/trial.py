"""What a trial is: one measured attempt at a batch size, and the memory model fitted to trials."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal

from batchfit.checks import Mode as Mode
from batchfit.units import format_bytes

TrialOutcome = Literal["ok", "oom", "over_budget"]


@dataclass(frozen=True)
class Trial:
    """One measured attempt at a batch size."""

    batch_size: int
    outcome: TrialOutcome
    peak_bytes: int  # allocated peak of the last (steady-state) step; for "oom", before the failure
    step_seconds: float | None  # seconds of the last (steady-state) step; None if it failed
    detail: str = ""  # why it failed, in a line
    optimizer_peak_bytes: int | None = None  # peak inside optimizer.step
    activation_peak_bytes: int | None = None  # peak outside it (forward, backward)
    allocator_retries: int = 0  # times a caching allocator freed its cache to go on (they cost speed)
    reserved_peak_bytes: int | None = None  # what a caching allocator held at most (CUDA)
    reused: bool = False  # measured by an earlier search (another fraction) and judged again
    steps: int | None = None  # the steps it ran (a confirmation runs more); for "oom", was to run
    steady_from: int | None = None  # it ended early: the allocator's state after this step recurred
    failed_at_step: int | None = None  # for "oom": the step that ran out (0: before the first)

    @property
    def fits(self) -> bool:
        return self.outcome == "ok"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def line(self, label: str, usual_steps: int | None = None) -> str:
        """The trial in a line: its label, batch, outcome and peak; the step that ran out of
        memory, or the steps when not ``usual_steps``; the step time, and on a GPU what the
        allocator reserved and its retries."""
        peak = format_bytes(self.peak_bytes) if self.peak_bytes else "-"  # 0: failed before a step
        extras = []
        if self.failed_at_step is not None and self.steps is not None:
            step = self.failed_at_step
            extras.append(f"out at step {step} of {self.steps}" if step else "out in the warm-up step")
        elif self.steps is not None and usual_steps is not None and self.steps != usual_steps:
            repeated = f" (state of step {self.steady_from} repeated)" if self.steady_from is not None else ""
            extras.append(f"{self.steps} steps{repeated}")
        if self.step_seconds is not None:
            extras.append(f"{self.step_seconds * 1000:8.1f} ms/step")
        if self.reserved_peak_bytes is not None:
            extras.append(f"reserved {format_bytes(self.reserved_peak_bytes)}")
        if self.allocator_retries:
            extras.append(f"{self.allocator_retries} allocator retries")
        return (
            f"{label:<5} batch_size={self.batch_size:<6} {self.outcome:<11} "
            f"peak {peak:>11}{''.join('  ' + extra for extra in extras)}"
        )


@dataclass(frozen=True)
class MemoryModel:
    """Peak memory as straight lines in the batch size, fitted through two trials.

    ``fixed_bytes + bytes_per_sample * batch_size`` is the peak outside ``optimizer.step``
    (forward, backward: activations). Where the device measures the phases apart, the peak inside
    the step (weights, gradients, optimizer state and its temporaries, nearly flat in the batch)
    is a second line, ``step_fixed_bytes + step_bytes_per_sample * batch_size``: it often
    dominates small batches, and fitting one line to both phases would misjudge the slope.
    """

    fixed_bytes: float
    bytes_per_sample: float
    fitted_on: tuple[int, int]  # the two batch sizes the lines go through
    step_fixed_bytes: float | None = None
    step_bytes_per_sample: float | None = None

    def _lines(self) -> list[tuple[float, float]]:
        lines = [(self.fixed_bytes, self.bytes_per_sample)]
        if self.step_fixed_bytes is not None and self.step_bytes_per_sample is not None:
            lines.append((self.step_fixed_bytes, self.step_bytes_per_sample))
        return lines

    def max_batch_size(self, budget_bytes: int) -> int | None:
        """Largest batch predicted to fit the budget; None when no line bounds it (no slope yet)."""
        bounds = []
        for fixed, slope in self._lines():
            if slope > 0:
                bounds.append(math.floor((budget_bytes - fixed) / slope))
            elif fixed > budget_bytes:
                bounds.append(0)
        return min(bounds) if bounds else None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def through(cls, low: Trial, high: Trial) -> MemoryModel:
        span = high.batch_size - low.batch_size
        if low.activation_peak_bytes is None or high.activation_peak_bytes is None:
            slope = (high.peak_bytes - low.peak_bytes) / span
            return cls(low.peak_bytes - slope * low.batch_size, slope, (low.batch_size, high.batch_size))
        slope = (high.activation_peak_bytes - low.activation_peak_bytes) / span
        low_step, high_step = low.optimizer_peak_bytes or 0, high.optimizer_peak_bytes or 0
        step_slope = (high_step - low_step) / span
        return cls(
            low.activation_peak_bytes - slope * low.batch_size,
            slope,
            (low.batch_size, high.batch_size),
            low_step - step_slope * low.batch_size,
            step_slope,
        )

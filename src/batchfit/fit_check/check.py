"""``check``: whether a workload still fits a given batch size in a given memory, and the margin it
has; what a team runs in CI so that a model change that breaks the batch size fails there, not on
the cluster."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from typing import Any, ClassVar

from typing_extensions import Unpack

from batchfit.checks import check_positive_int
from batchfit.errors import DoesNotFitError
from batchfit.options import BatchSizes, Trials, Where, mode_named
from batchfit.policy.search.trial import Mode, Trial
from batchfit.progress import OnProgress
from batchfit.result import stamped
from batchfit.runtime.workloads.entry import check_entry
from batchfit.runtime.workloads.workload import Workload
from batchfit.search.find_batch_size import find_on
from batchfit.units import format_bytes
from batchfit.where import WhereShorthand, target_of


@dataclass(frozen=True)
class FitCheck:
    """Whether ``batch_size`` fits, the trial that says so, and the margin to the budget."""

    mode: Mode
    batch_size: int
    fits: bool
    trial: Trial  # the trial at batch_size (on CUDA, of the confirming steps)
    budget_bytes: int  # memory_fraction x capacity_bytes
    capacity_bytes: int
    memory_fraction: float
    device: str

    @property
    def margin_bytes(self) -> int:
        """The budget left over the trial's peak; negative over the budget. For a trial that ran out
        of memory the peak is what it held before the failing allocation: the margin is at most this."""
        return self.budget_bytes - self.trial.peak_bytes

    command: ClassVar[str] = "check"

    def to_dict(self) -> dict[str, Any]:
        data = {**asdict(self), "margin_bytes": self.margin_bytes, "summary": self.summary()}
        return stamped(self.command, data)

    def table(self) -> str:
        """The verdict, then the trial that gives it, as its line reads on stderr."""
        return f"{self.summary()}\n{self.trial.line(self.mode)}\n"

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"

    def summary(self) -> str:
        budget = (
            f"a {format_bytes(self.budget_bytes)} budget = {self.memory_fraction:g} x "
            f"{format_bytes(self.capacity_bytes)} on {self.device}"
        )
        if self.fits:
            share = self.margin_bytes / self.budget_bytes
            return (
                f"{self.mode}: batch_size={self.batch_size} fits: peak {format_bytes(self.trial.peak_bytes)} "
                f"of {budget}, a margin of {format_bytes(self.margin_bytes)} ({share:.1%} of the budget)."
            )
        if self.trial.outcome == "oom":
            why = f"it ran out of memory ({self.trial.detail})"
        else:
            over = -self.margin_bytes
            why = f"its peak {format_bytes(self.trial.peak_bytes)} is {format_bytes(over)} over the budget"
        return (
            f"{self.mode}: batch_size={self.batch_size} does not fit {budget}: {why}. Lower the batch "
            f"size, or give it more memory, or shrink what the step holds (mixed precision, activation "
            f"checkpointing); `batchfit find` says what fits now."
        )


def check(
    workload: Workload,
    batch_size: int,
    mode: Mode = "train",
    *,
    where: Where | None = None,
    trials: Trials = Trials(),
    on_progress: OnProgress | None = None,
    **shorthand: Unpack[WhereShorthand],
) -> FitCheck:
    """Whether ``mode``'s step still fits ``batch_size`` under a hard cap at ``memory_fraction`` x
    the device's memory (``memory_limit``: a device of that size), measured as ``find`` measures
    its answer (its confirming steps on CUDA), with the margin to the budget. It raises nothing
    for a batch that does not fit: ``FitCheck.fits`` says so, and ``summary()`` by how much and
    what to do. The model, optimizer and RNG are left as they were.
    ``where`` says where to measure (a ``batchfit.Where``); ``device``, ``memory_limit`` and
    ``memory_fraction`` are its shorthand for the one-line call (one that disagrees with
    ``where`` is a ConfigurationError).
    """
    check_entry("check", workload, on_progress, trials=(trials, Trials))
    check_positive_int("batch_size", batch_size)
    target = target_of("check", where, shorthand)
    named = mode_named(mode)
    exactly = BatchSizes(batch_size, batch_size)
    # The training state an eval step meets is resident after any training step: the smallest.
    trials = trials if trials.warm_batch_size is not None else replace(trials, warm_batch_size=1)
    try:
        result = find_on(target, workload, named, exactly, trials, on_progress)
    except DoesNotFitError as error:
        if error.trial is None or error.budget_bytes is None or error.capacity_bytes is None:
            raise
        return FitCheck(
            named,
            batch_size,
            False,
            error.trial,
            error.budget_bytes,
            error.capacity_bytes,
            target.memory_fraction,
            target.device.name,
        )
    return FitCheck(
        named,
        batch_size,
        True,
        result.answer,
        result.budget_bytes,
        result.capacity_bytes,
        result.memory_fraction,
        result.device,
    )

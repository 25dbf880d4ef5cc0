"""The micro-batch decisions, free of torch: the divisor of the per-device batch that plan chooses
(the largest that fits, or a forced one) or explore lists (every one in a range), and the micro-batch
a ``MicroBatchStep`` runs at (halved after an out-of-memory, grown back after clean steps)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from batchfit.checks import check_divisible as check_divisible
from batchfit.checks import check_positive_int
from batchfit.errors import ConfigurationError, DoesNotFitError

#: A chosen micro-batch must use at least this share of max_micro_batch_size (or the whole
#: per-device batch, if that is smaller); otherwise the global batch is refused with nearby ones.
MIN_MICRO_BATCH_FRACTION = 0.5


def micro_batch_sizes(
    min_batch_size: int,
    max_batch_size: int,
    *,
    multiple_of: int | None = None,
    global_batch_size: int | None = None,
    world_size: int = 1,
) -> list[int]:
    """The micro-batches explore may recommend: in [min_batch_size, max_batch_size], multiples of
    ``multiple_of``, and dividing ``global_batch_size / world_size`` when that is given."""
    check_divisible(global_batch_size, world_size)
    sizes = [
        batch
        for batch in range(min_batch_size, max_batch_size + 1)
        if not (multiple_of and batch % multiple_of)
        and (global_batch_size is None or (global_batch_size // world_size) % batch == 0)
    ]
    if not sizes:
        constraints = [f"multiple_of={multiple_of}"] if multiple_of else []
        if global_batch_size is not None:
            constraints.append(f"global_batch_size={global_batch_size} / world_size={world_size}")
        raise ConfigurationError(
            f"no micro-batch in [{min_batch_size}, {max_batch_size}] satisfies "
            f"{' and '.join(constraints)}; loosen one or widen the range."
        )
    return sizes


def forced_micro_batch(global_batch_size: int, world_size: int, micro_batch_size: int) -> int:
    step = world_size * micro_batch_size
    if global_batch_size % step:
        below = global_batch_size // step * step
        nearby = f"{below} or {below + step}" if below else f"{step}"
        raise ConfigurationError(
            f"global_batch_size ({global_batch_size}) is not divisible by world_size x micro_batch_size "
            f"({world_size} x {micro_batch_size} = {step}); {nearby} would work."
        )
    return micro_batch_size


def chosen_micro_batch(global_batch_size: int, world_size: int, max_micro_batch_size: int) -> int:
    micro = _good_micro_batch(global_batch_size, world_size, max_micro_batch_size)
    if micro is not None:
        return micro
    below = next(
        (
            size
            for size in range(global_batch_size - 1, 0, -1)
            if _good_micro_batch(size, world_size, max_micro_batch_size)
        ),
        None,
    )
    above = next(
        size
        for size in range(global_batch_size + 1, global_batch_size + world_size * max_micro_batch_size + 1)
        if _good_micro_batch(size, world_size, max_micro_batch_size)
    )  # a multiple of world_size x max_micro_batch_size always works
    nearby = f"{below} or {above}" if below else f"{above}"
    if global_batch_size % world_size:
        raise ConfigurationError(
            f"global_batch_size ({global_batch_size}) is not divisible by world_size ({world_size}); "
            f"{nearby} would work."
        )
    per_device = global_batch_size // world_size
    largest = _largest_divisor(per_device, max_micro_batch_size)
    raise ConfigurationError(
        f"global_batch_size ({global_batch_size}) is {per_device} samples per device on world_size "
        f"{world_size}, and the largest micro_batch_size up to max_micro_batch_size "
        f"({max_micro_batch_size}) that divides {per_device} is {largest} "
        f"({per_device // largest} accumulation_steps), under half of {max_micro_batch_size}; {nearby} "
        f"would work, or pass micro_batch_size to force one."
    )


def _good_micro_batch(global_batch_size: int, world_size: int, max_micro_batch_size: int) -> int | None:
    """The largest divisor of the per-device batch up to the maximum, if it is not too small."""
    if global_batch_size % world_size:
        return None
    per_device = global_batch_size // world_size
    micro = _largest_divisor(per_device, max_micro_batch_size)
    enough = MIN_MICRO_BATCH_FRACTION * min(per_device, max_micro_batch_size)
    return micro if micro >= enough else None


def _largest_divisor(number: int, limit: int) -> int:
    if number <= limit:
        return number
    best = 1
    for small in range(1, math.isqrt(number) + 1):
        if number % small == 0:
            for divisor in (small, number // small):
                if best < divisor <= limit:
                    best = divisor
    return best


@dataclass(frozen=True)
class MicroBatchChange:
    """One change of the micro-batch size, and why."""

    optimizer_step: int  # the optimizer step (0-based) that first runs at new_micro_batch_size
    old_micro_batch_size: int
    new_micro_batch_size: int
    reason: str  # "out of memory in backward", "grew back after 100 clean steps"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def split(batch_size: int, micro_batch_size: int) -> list[int]:
    """The sizes of the micro-batches of a batch: ``micro_batch_size`` each, the last one the rest."""
    if batch_size < 1 or micro_batch_size < 1:
        raise ValueError(f"cannot split {batch_size} samples into micro-batches of {micro_batch_size}")
    full, rest = divmod(batch_size, micro_batch_size)
    return [micro_batch_size] * full + ([rest] if rest else [])


@dataclass(frozen=True)
class MicroBatchOutcome:
    """One rank's micro-batch, as it tells the others: the samples of its batch; where it ran out of
    memory ("forward", "backward", "the training step") and the error's first line, or None; after
    the last micro-batch of a DistributedDataParallel model, which parameters hold a gradient."""

    samples: int
    failure: tuple[str, str] | None = None
    gradients: tuple[bool, ...] | None = None


def merge_outcomes(outcomes: Sequence[MicroBatchOutcome], *, ranks: bool) -> tuple[str, str] | None:
    """Where a micro-batch ran out of memory on any rank (index = rank), and the first error; None if
    nowhere. With ``ranks``, the place names the ranks ("backward on rank 1"). The ranks' batches must
    hold as many samples: otherwise they would run different micro-batches."""
    if len({outcome.samples for outcome in outcomes}) > 1:
        sizes = ", ".join(f"rank {rank}: {outcome.samples}" for rank, outcome in enumerate(outcomes))
        raise ConfigurationError(
            f"the ranks' batches hold different numbers of samples ({sizes}); under a process group "
            f"every rank's batch must hold as many (DistributedSampler gives each rank as many "
            f"samples), so that the ranks run the same micro-batches."
        )
    failed = [(rank, outcome.failure) for rank, outcome in enumerate(outcomes) if outcome.failure is not None]
    if not failed:
        return None
    if not ranks:
        return failed[0][1]
    where = ", ".join(f"{phase} on rank {rank}" for rank, (phase, _) in failed)
    return where, f"rank {failed[0][0]}: {failed[0][1][1]}"


class MicroBatchShrink:
    """Decides the micro-batch: start at ``micro_batch_size``; after an out-of-memory, half of the
    micro-batch that failed (at 1 it gives up with ``DoesNotFitError``); with ``grow_after``, double
    after that many clean optimizer steps in a row (steps without an out-of-memory), never above the
    starting micro-batch nor the batch.

    The caller reports what happened (``out_of_memory``, ``stepped``) and splits batches with
    ``sizes``. Ranks that report the same events hold the same micro-batch.
    """

    def __init__(self, micro_batch_size: int, *, grow_after: int | None = None) -> None:
        if not _is_count(micro_batch_size):
            raise ConfigurationError(
                f"micro_batch_size ({micro_batch_size!r}) must be a whole number of samples, 1 or more: the "
                f"largest micro-batch to run, halved after each out-of-memory."
            )
        if grow_after is not None and not _is_count(grow_after):
            raise ConfigurationError(
                f"grow_after ({grow_after!r}) must be a whole number of optimizer steps, 1 or more; None "
                f"never grows the micro-batch back."
            )
        self.start_micro_batch_size = micro_batch_size
        self.micro_batch_size = micro_batch_size
        self.grow_after = grow_after
        self.clean_steps = 0  # optimizer steps in a row without an out-of-memory, since the last change
        self._step_is_clean = True
        self._history: list[MicroBatchChange] = []

    @property
    def history(self) -> tuple[MicroBatchChange, ...]:
        return tuple(self._history)

    def sizes(self, batch_size: int) -> list[int]:
        """The micro-batches a batch of ``batch_size`` samples runs as now."""
        return split(batch_size, self.micro_batch_size)

    def out_of_memory(
        self, optimizer_step: int, batch_size: int, where: str, detail: str = ""
    ) -> MicroBatchChange:
        """The micro-batch that retries the batch after an out-of-memory ``where`` ("backward",
        "forward on rank 1"): half of the one that failed. Raises ``DoesNotFitError`` when that was
        a single sample."""
        failed = min(self.micro_batch_size, batch_size)
        self.clean_steps = 0
        self._step_is_clean = False
        if failed == 1:
            cause = f" The out-of-memory: {detail}" if detail else ""
            raise DoesNotFitError(
                f"out of memory in {where} at micro_batch_size 1 (optimizer step {optimizer_step}): not "
                f"even one sample fits beside the weights, gradients and optimizer state. Lower the memory "
                f"of a sample (shorter sequences, smaller images, activation checkpointing, mixed "
                f"precision) or of the model, or use a device with more memory. The optimizer did not "
                f"step and the batch's gradients were dropped.{cause}"
            )
        return self._change(optimizer_step, failed // 2, f"out of memory in {where}")

    def stepped(self, optimizer_step: int, batch_size: int) -> MicroBatchChange | None:
        """Optimizer step ``optimizer_step`` (0-based) is done; the change from the next step on, if any."""
        if self._step_is_clean:
            self.clean_steps += 1
        self._step_is_clean = True
        ceiling = min(self.start_micro_batch_size, batch_size)
        if self.grow_after is None or self.clean_steps < self.grow_after or self.micro_batch_size >= ceiling:
            return None
        grown = min(2 * self.micro_batch_size, ceiling)
        steps = f"{self.clean_steps} clean step{'' if self.clean_steps == 1 else 's'}"
        return self._change(optimizer_step + 1, grown, f"grew back after {steps}")

    def _change(self, optimizer_step: int, micro_batch_size: int, reason: str) -> MicroBatchChange:
        change = MicroBatchChange(optimizer_step, self.micro_batch_size, micro_batch_size, reason)
        self._history.append(change)
        self.micro_batch_size = micro_batch_size
        self.clean_steps = 0
        return change


def _is_count(value: object) -> bool:
    """A whole number, 1 or more (not a bool, not a float)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _check_split(
    global_batch_size: int, world_size: int, max_micro_batch_size: int | None, micro_batch_size: int | None
) -> None:
    check_positive_int("global_batch_size", global_batch_size)
    check_positive_int("world_size", world_size)
    if max_micro_batch_size is not None:
        check_positive_int("max_micro_batch_size", max_micro_batch_size)
    if micro_batch_size is not None:
        check_positive_int("micro_batch_size", micro_batch_size)
    if (
        micro_batch_size is not None
        and max_micro_batch_size is not None
        and micro_batch_size > max_micro_batch_size
    ):
        raise ConfigurationError(
            f"micro_batch_size ({micro_batch_size}) is larger than max_micro_batch_size "
            f"({max_micro_batch_size}); lower micro_batch_size or raise max_micro_batch_size."
        )


def plan_micro_batch(
    global_batch_size: int, world_size: int, max_micro_batch_size: int | None, micro_batch_size: int | None
) -> int:
    """The micro-batch of each forward. The per-device batch ``global_batch_size / world_size`` must
    be whole. Unless ``micro_batch_size`` forces one (which must divide the per-device batch), it is
    the largest divisor of the per-device batch up to ``max_micro_batch_size``, so accumulation_steps
    is the fewest possible. A divisor under half of ``max_micro_batch_size`` (when the per-device batch
    is larger than it) wastes the memory that was measured, so that global batch is refused and the
    nearest ones that work are named. The split's values are checked first (``_check_split``)."""
    _check_split(global_batch_size, world_size, max_micro_batch_size, micro_batch_size)
    if micro_batch_size is not None:
        return forced_micro_batch(global_batch_size, world_size, micro_batch_size)
    if max_micro_batch_size is not None:
        return chosen_micro_batch(global_batch_size, world_size, max_micro_batch_size)
    raise ConfigurationError(
        "plan needs max_micro_batch_size (the largest micro-batch that fits) or micro_batch_size."
    )

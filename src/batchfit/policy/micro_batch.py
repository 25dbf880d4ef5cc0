"""Micro-batches that split a global batch: a divisor of the per-device batch, chosen for plan
(the largest that fits, or a forced one) or listed for explore (every one in a range)."""

from __future__ import annotations

import math

from batchfit.errors import ConfigurationError

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


def check_divisible(global_batch_size: int | None, world_size: int) -> None:
    """``global_batch_size`` (when given) splits evenly over ``world_size`` devices."""
    if global_batch_size is not None and global_batch_size % world_size:
        below = global_batch_size // world_size * world_size or world_size
        raise ConfigurationError(
            f"global_batch_size ({global_batch_size}) is not divisible by world_size ({world_size}); "
            f"{below} or {(global_batch_size // world_size + 1) * world_size} would work."
        )


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

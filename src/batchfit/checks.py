"""The checks and defaults every verb shares: positive sizes, ranges, memory fractions, and the
upper bounds of a search (eval's is twice train's: an eval step keeps no activations for backward)."""

from __future__ import annotations

import math
from dataclasses import field
from typing import Any

from batchfit.errors import ConfigurationError
from batchfit.policy.trial import Mode

#: Upper bound of a training search when none is given (the seed's MAX_BATCH_SIZE).
DEFAULT_MAX_BATCH_SIZE = 512
#: An eval search's default upper bound is this many times the training one.
EVAL_BATCH_FACTOR = 2


def default_max_batch_size(mode: Mode, train_max_batch_size: int = DEFAULT_MAX_BATCH_SIZE) -> int:
    """The upper bound of a ``mode`` search when the user gave ``train_max_batch_size`` for training."""
    return train_max_batch_size * (EVAL_BATCH_FACTOR if mode == "eval" else 1)


def check_positive_int(name: str, value: object, minimum: int = 1) -> int:
    """``value`` when it is an integer (not a bool) of at least ``minimum``; else an error naming it."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        kind = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise ConfigurationError(f"{name} must be {kind}, got {value!r}.")
    return value


def check_positive_number(name: str, value: object, allow_zero: bool = False) -> None:
    number = value if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan
    if not (number > 0 or (allow_zero and number == 0)) or math.isinf(number):
        kind = "a non-negative number" if allow_zero else "a positive number"
        raise ConfigurationError(f"{name} must be {kind}, got {value!r}.")


def check_batch_range(min_batch_size: object, max_batch_size: object) -> None:
    """Both positive integers, the smaller first."""
    low = check_positive_int("min_batch_size", min_batch_size)
    high = check_positive_int("max_batch_size", max_batch_size)
    if low > high:
        raise ConfigurationError(
            f"min_batch_size ({min_batch_size}) is larger than max_batch_size ({max_batch_size}); "
            f"pass min_batch_size <= max_batch_size."
        )


def check_memory_fraction(memory_fraction: object, name: str = "memory_fraction") -> None:
    if (
        isinstance(memory_fraction, bool)
        or not isinstance(memory_fraction, (int, float))
        or not 0 < memory_fraction <= 1
    ):
        raise ConfigurationError(
            f"{name}={memory_fraction!r} must be in (0, 1]: the share of device memory a batch may use."
        )


def option(default: Any, help: str, *, cli: bool = True) -> Any:
    """An options object's field: its default (``dataclasses.MISSING``: none, the flag is required)
    and the one-line help its flag shows (``cli=False``: no flag)."""
    return field(default=default, metadata={"help": help, "cli": cli})

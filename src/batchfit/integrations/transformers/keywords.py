"""The keywords batchfit adds to a Trainer, checked for their types when the Trainer is made: a wrong
one says what it expected, what it got and what to pass, before any work is done."""

from __future__ import annotations

from typing import Any

import torch

from batchfit.errors import ConfigurationError
from batchfit.options import BatchSizes, Trials


class KeywordTypeError(ConfigurationError, TypeError):
    """A keyword of ``BatchfitTrainer`` (or ``BatchfitMixin``) has a type it cannot take."""


def check_keywords(device: Any, memory_limit: Any, memory_fraction: Any, sizes: Any, trials: Any) -> None:
    """Raise ``KeywordTypeError`` for the first keyword of the wrong type, naming what to pass."""
    _expect(
        "device",
        device,
        device is None or isinstance(device, str | torch.device),
        "a device name or a torch.device",
        'device="cuda:0" (or device=torch.device("cuda", 0))',
    )
    integral = isinstance(memory_limit, int) and not isinstance(memory_limit, bool)
    _expect(
        "memory_limit",
        memory_limit,
        memory_limit is None or isinstance(memory_limit, str) or integral,
        'a size such as "8GiB" or a number of bytes (int)',
        'memory_limit="8GiB" (or memory_limit=8 * 2**30)',
    )
    number = isinstance(memory_fraction, int | float) and not isinstance(memory_fraction, bool)
    _expect(
        "memory_fraction",
        memory_fraction,
        number,
        "a number in (0, 1]",
        "memory_fraction=0.8",
    )
    example = sizes if isinstance(sizes, int) and not isinstance(sizes, bool) else 64
    _expect(
        "sizes",
        sizes,
        isinstance(sizes, BatchSizes),
        "a batchfit.BatchSizes",
        f"sizes=batchfit.BatchSizes(max_batch_size={example})",
    )
    steps = trials if isinstance(trials, int) and not isinstance(trials, bool) else 2
    _expect(
        "trials",
        trials,
        isinstance(trials, Trials),
        "a batchfit.Trials",
        f"trials=batchfit.Trials(steps_per_trial={steps})",
    )


def _expect(name: str, value: Any, good: bool, expected: str, advice: str) -> None:
    if not good:
        raise KeywordTypeError(
            f"{name} must be {expected}, got {type(value).__name__} {value!r}; pass {advice}."
        )

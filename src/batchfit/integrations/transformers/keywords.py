"""The keywords batchfit adds to a Trainer, checked for their types when the Trainer is made: a wrong
one says what it expected, what it got and what to pass, before any work is done."""

from __future__ import annotations

from typing import Any

import torch

from batchfit.checks import check_option, check_type
from batchfit.options import BatchSizes, Trials

OWNER = "BatchfitTrainer"


def check_keywords(device: Any, memory_limit: Any, memory_fraction: Any, sizes: Any, trials: Any) -> None:
    """Raise ``ArgumentTypeError`` for the first keyword of the wrong type, naming what to pass."""
    check_type(
        f"{OWNER}'s device",
        device,
        device is None or isinstance(device, str | torch.device),
        "a device name or a torch.device",
        'device="cuda:0" (or device=torch.device("cuda", 0))',
    )
    integral = isinstance(memory_limit, int) and not isinstance(memory_limit, bool)
    check_type(
        f"{OWNER}'s memory_limit",
        memory_limit,
        memory_limit is None or isinstance(memory_limit, str) or integral,
        'a size such as "8GiB" or a number of bytes (int)',
        'memory_limit="8GiB" (or memory_limit=8 * 2**30)',
    )
    number = isinstance(memory_fraction, int | float) and not isinstance(memory_fraction, bool)
    check_type(
        f"{OWNER}'s memory_fraction", memory_fraction, number, "a number in (0, 1]", "memory_fraction=0.8"
    )
    check_option(OWNER, "sizes", sizes, BatchSizes)
    check_option(OWNER, "trials", trials, Trials)

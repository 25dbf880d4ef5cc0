"""Scaling a running optimizer's learning rate by a factor, so that its scheduler keeps the scale:
the batch schedule's change applied to the optimizer that trains."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch


def scale_learning_rate(
    optimizer: torch.optim.Optimizer, factor: float, schedulers: Iterable[Any] = ()
) -> None:
    """Multiply every param group's learning rate (and ``initial_lr``, where a scheduler keeps it)
    by ``factor``, and the ``base_lrs`` of each scheduler in ``schedulers``: a ``LambdaLR`` (such
    as ``warmup_schedule`` and the Hugging Face schedules) computes each step's rate from them, so
    without this it would undo the change at its next step."""
    for group in optimizer.param_groups:
        group["lr"] = group["lr"] * factor
        if "initial_lr" in group:
            group["initial_lr"] = group["initial_lr"] * factor
    for scheduler in schedulers:
        if hasattr(scheduler, "base_lrs"):
            scheduler.base_lrs = [rate * factor for rate in scheduler.base_lrs]

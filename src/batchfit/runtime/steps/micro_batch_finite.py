"""``MicroBatchStep``'s guard against a step that does not train: its micro-batches' losses and the
accumulated gradients are read for NaN and inf before the optimizer steps (where no enabled
``GradScaler`` skips such steps itself), and what was not finite is named."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal

import torch
from torch import nn

from batchfit.runtime.steps.finite import _finite, _non_finite

#: What a ``MicroBatchStep`` does with a step whose loss or gradients are not finite: raise
#: ``NonFiniteError``, or skip the optimizer step as a ``GradScaler`` does (logged and counted).
NonFinite = Literal["raise", "skip"]
NON_FINITE: tuple[NonFinite, ...] = ("raise", "skip")


def scaler_in_charge(scaler: Any) -> bool:
    """Whether an enabled ``GradScaler`` skips the steps whose gradients are not finite."""
    return scaler is not None and bool(scaler.is_enabled())


def all_finite(losses: Sequence[torch.Tensor], parameters: Sequence[nn.Parameter]) -> bool:
    """Whether every loss and every gradient is finite: one flag per device, read in one transfer."""
    gradients = [parameter.grad for parameter in parameters if parameter.grad is not None]
    flags = [_finite(gradients)] + [torch.stack(list(losses)).isfinite().all()] * bool(losses)
    on = next((flag.device for flag in flags if flag.device.type != "cpu"), flags[0].device)
    return bool(torch.stack([flag.to(on) for flag in flags]).all())


def what_is_not_finite(
    losses: Sequence[tuple[int, torch.Tensor]],
    sizes: Sequence[int],
    named: Sequence[tuple[str, nn.Parameter]],
) -> str:
    """The first micro-batch whose loss is not finite (its index, samples and value), else the
    parameters whose accumulated gradients are not, or '' where all are finite here."""
    samples = sum(sizes)
    for index, loss in losses:
        value = float(loss)
        if not math.isfinite(value):
            start = sum(sizes[:index])
            return (
                f"the loss of micro-batch {index + 1} of {len(sizes)} (samples {start} to "
                f"{start + sizes[index] - 1} of {samples}) is {value}"
            )
    gradients = [(name, parameter.grad) for name, parameter in named if parameter.grad is not None]
    names = _non_finite(gradients)
    if not names:
        return ""
    return (
        f"the gradients of {names} are not finite (NaN or inf) after the step's {len(sizes)} "
        f"micro-batches, whose losses are finite"
    )

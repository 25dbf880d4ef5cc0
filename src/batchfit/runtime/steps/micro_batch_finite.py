"""``MicroBatchStep``'s guard against a step that does not train: its micro-batches' losses and the
accumulated gradients are read for NaN and inf before the optimizer steps (where no enabled
``GradScaler`` skips such steps itself), and what was not finite is named."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, Literal

import torch
from torch import nn

from batchfit.errors import NonFiniteError
from batchfit.runtime.steps.finite import WHAT_TO_CHECK, _finite, _non_finite

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


def ranks_not_finite(
    exchange: Callable[[Callable[[], str]], list[str]],
    losses: Sequence[tuple[int, torch.Tensor]],
    sizes: list[int],
    model: nn.Module,
    parameters: Sequence[nn.Parameter],
) -> str | None:
    """What is not finite among the losses and gradients, on every rank that holds one (the ranks
    decide together through ``exchange``); None where all are finite."""

    def here() -> str:
        if all_finite([loss for _, loss in losses], parameters):
            return ""
        return what_is_not_finite(losses, sizes, list(model.named_parameters()))

    found = exchange(here)
    if not any(found):
        return None
    if len(found) == 1:
        return found[0]
    return "; ".join(f"on rank {rank}, {cause}" for rank, cause in enumerate(found) if cause)


def non_finite_error(optimizer_step: int, micro_batch_size: int, cause: str) -> NonFiniteError:
    return NonFiniteError(
        f"MicroBatchStep, optimizer step {optimizer_step} (micro_batch_size {micro_batch_size}): {cause}; "
        f"the optimizer did not step and the batch's gradients were dropped. Pass non_finite='skip' to "
        f"skip such a step as a GradScaler does. {WHAT_TO_CHECK}"
    )

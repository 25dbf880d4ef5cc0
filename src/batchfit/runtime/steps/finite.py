"""Steps that do not train, caught: a trial's losses must be finite, and so must the gradients (where
no GradScaler skips the steps they overflow) and the trained parameters after its steps."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from batchfit.errors import NonFiniteError
from batchfit.runtime.devices.tracker import dense_parts

#: What a step that does not train asks its user to look at.
WHAT_TO_CHECK = (
    "Check the learning rate (too high diverges), the data (a NaN or inf in a batch), the loss (a log or "
    "a division of 0), and under float16 mixed precision that a GradScaler scales the backward "
    "(scaler.scale(loss).backward(), scaler.step(optimizer), scaler.update()) of a loss computed in float32."
)


class LossLog:
    """The losses a trial's steps return, kept without waiting for the device, read at its end.

    A loss on the CPU is read as it comes: it is there, and reading it allocates nothing. A loss on
    an accelerator is added into its step's slot of a buffer on the device, made before the trial's
    measurement (so it is not counted in it), and read once, at the trial's end: no step waits.
    """

    def __init__(self, device: torch.device, capacity: int) -> None:
        """A log on ``device`` of ``capacity`` steps, the most a trial runs."""
        accelerated = device.type != "cpu"
        self.slots = torch.zeros(capacity, dtype=torch.float64, device=device) if accelerated else None
        self.first: tuple[int, float] | None = None  # a loss read on the CPU: the first non-finite
        self.step = 0

    def record(self, returned: Any) -> None:
        """Keep the loss in what a step (or its loss function) returned, at ``self.step``."""
        loss = loss_in(returned)
        if loss is None or self.step < 1:
            return
        if isinstance(loss, torch.Tensor) and loss.device.type != "cpu" and self.slots is not None:
            if self.step <= len(self.slots):
                self.slots[self.step - 1].add_(loss.detach().to(self.slots.device))
            return
        # A loss on the CPU (or a number): nothing to wait for.
        value = loss.detach().item() if isinstance(loss, torch.Tensor) else loss
        if self.first is None and not math.isfinite(value):
            self.first = (self.step, value)

    def finite(self) -> torch.Tensor:
        """Whether every loss was finite: a flag on the buffer's device, read by the caller."""
        if self.slots is None:
            return torch.tensor(self.first is None)
        return self.slots.isfinite().all()

    def first_non_finite(self) -> tuple[int, float] | None:
        """The first step whose loss was not finite, and that loss (reading the device's buffer)."""
        if self.slots is None:
            return self.first
        for index, value in enumerate(self.slots.tolist()):
            if not math.isfinite(value):
                return index + 1, value
        return None


def loss_in(returned: Any) -> torch.Tensor | float | None:
    """The loss in what a step returned: a floating-point scalar tensor, a float, or an output's
    ``loss`` (an attribute or key); None where there is none to read."""
    if isinstance(returned, Mapping):
        returned = returned.get("loss")
    elif not isinstance(returned, (torch.Tensor, float)):
        returned = getattr(returned, "loss", None)
    if isinstance(returned, float):
        return returned
    if (
        isinstance(returned, torch.Tensor)
        and returned.dim() == 0
        and returned.is_floating_point()
        and not is_traceable_wrapper_subclass(returned)  # a DTensor's value is the ranks' to agree on
    ):
        return returned
    return None


def check_finite(
    module: torch.nn.Module, mode: str, scaled: bool, losses: LossLog, batch_size: int, steps: int
) -> None:
    """A ``NonFiniteError`` where the ``mode`` trial of ``steps`` steps at ``batch_size`` did not
    train: a loss in ``losses`` is not finite or, in training, the gradients the last step left
    (unless ``scaled``: a GradScaler skips the steps whose gradients overflow) or ``module``'s
    trained parameters are not.

    The losses, gradients and parameters are read together, once: each is reduced on its device
    to one flag, and the flags are read in one transfer. Only where one is false are they read
    again, to name the step or the tensors."""
    parameters = [(name, p) for name, p in module.named_parameters() if p.requires_grad]
    parameters = parameters if mode == "train" else []
    gradients = [(name, p.grad) for name, p in parameters if p.grad is not None and not scaled]
    flags = [losses.finite(), _finite(t for _, t in gradients), _finite(t for _, t in parameters)]
    on = next((flag.device for flag in flags if flag.device.type != "cpu"), flags[0].device)
    if bool(torch.stack([flag.to(on) for flag in flags]).all()):
        return
    where = f"at batch_size={batch_size}"
    found = losses.first_non_finite()
    if found is not None:
        step, value = found
        raise NonFiniteError(
            f"the {mode} step's loss is {value} {where}, step {step} of {steps}; batchfit does not "
            f"answer from steps that do not train. {WHAT_TO_CHECK}"
        )
    last = f"{where}, step {steps} of {steps} (the trial's last)"
    named = _non_finite(gradients)
    if named:
        raise NonFiniteError(
            f"the gradients of {named} are not finite (NaN or inf) after the {mode} step {last}, and "
            f"no GradScaler skips the steps they overflow: the optimizer steps on them. {WHAT_TO_CHECK}"
        )
    raise NonFiniteError(
        f"the parameters {_non_finite(parameters)} are not finite (NaN or inf) after the {mode} step "
        f"{last}: an optimizer step took non-finite gradients, or they were so before the search. "
        f"{WHAT_TO_CHECK}"
    )


def _floating_parts(tensors: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    """The floating-point tensors holding ``tensors``' values (a sparse gradient's values)."""
    return [part for tensor in tensors for part in dense_parts(tensor) if part.is_floating_point()]


def _finite(tensors: Iterable[torch.Tensor]) -> torch.Tensor:
    """Whether every value of ``tensors`` is finite: a flag on their device, computed there (the
    largest magnitude, by a fused reduction per device and dtype), not read."""
    parts = _floating_parts(tensors)
    if not parts:
        return torch.tensor(True)
    return torch.nn.utils.get_total_norm(parts, norm_type=math.inf).isfinite()


def _non_finite(named: Sequence[tuple[str, torch.Tensor]], shown: int = 3) -> str:
    """The names of the tensors that hold a NaN or inf, quoted, the first ``shown`` of them."""
    names = [name for name, tensor in named if not all(p.isfinite().all() for p in _floating_parts([tensor]))]
    listed = ", ".join(repr(name) for name in names[:shown])
    return listed + (f" and {len(names) - shown} more" if len(names) > shown else "")

"""Snapshot and restore of everything a trial may change: weights, gradients, optimizer, RNG,
modes, and the GradScalers and learning-rate schedulers the training step uses.

Tensors are restored in place (the user's ``Parameter`` and buffer objects stay the same objects)
from copies kept on the CPU, so the copies take no device memory while trials run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from batchfit.runtime.devices.tracker import wrapped_optimizers
from batchfit.runtime.distributed.sharded import reshard
from batchfit.runtime.steps.reach import grad_scalers, lr_schedulers, step_state
from batchfit.runtime.steps.saved import (
    OptimizerState,
    RngState,
    ScalerState,
    SchedulerState,
    TensorSlot,
    host_copy,
)


@dataclass
class TrainingSnapshot:
    """The state of a model and optimizer at one moment, and of the modules and optimizers the
    steps reach beside them (``step_state``); ``restore`` puts it back bit for bit."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer | None
    slots: list[TensorSlot] = field(default_factory=list)
    grads: list[tuple[torch.nn.Parameter, torch.Tensor | None]] = field(default_factory=list)
    # The other modules' gradients: a trial does not set them aside (they are the user's to
    # zero), but every restore puts them back.
    other_grads: list[tuple[torch.nn.Parameter, torch.Tensor | None]] = field(default_factory=list)
    modes: list[tuple[torch.nn.Module, bool]] = field(default_factory=list)
    optimizers: list[OptimizerState] = field(default_factory=list)
    rng: RngState | None = None
    scalers: list[ScalerState] = field(default_factory=list)
    schedulers: list[SchedulerState] = field(default_factory=list)

    @classmethod
    def capture(
        cls,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None,
        steps: Iterable[Callable[..., Any] | None] = (),
    ) -> TrainingSnapshot:
        """The state of ``model`` and ``optimizer``, and of the GradScalers, learning-rate
        schedulers, modules and optimizers ``steps`` (the workload's ``train_step`` and
        ``eval_step``) use."""
        snap = cls(model=model, optimizer=optimizer, rng=RngState.capture())
        steps = list(steps)
        snap.scalers = [ScalerState.capture(scaler) for scaler in grad_scalers(*steps)]
        snap.schedulers = [SchedulerState.capture(scheduler) for scheduler in lr_schedulers(*steps)]
        others = step_state(model, optimizer, steps)
        modules = [model, *(other for other in others if isinstance(other, torch.nn.Module))]
        seen: set[int] = set()
        for module in (submodule for owner in modules for submodule in owner.modules()):
            if id(module) in seen:
                continue
            seen.add(id(module))
            snap.modes.append((module, module.training))
            for table in (module._parameters, module._buffers):
                for name, tensor in table.items():
                    if tensor is not None:
                        snap.slots.append(TensorSlot.of(table, name, tensor))
        own = {id(parameter) for parameter in model.parameters()}
        for parameter in model.parameters():
            grad = parameter.grad
            snap.grads.append((parameter, None if grad is None else host_copy(grad)))
        for owner in modules[1:]:
            for parameter in owner.parameters():
                if id(parameter) not in own:
                    own.add(id(parameter))
                    grad = parameter.grad
                    snap.other_grads.append((parameter, None if grad is None else host_copy(grad)))
        optimizers = [optimizer, *(other for other in others if isinstance(other, torch.optim.Optimizer))]
        held: dict[int, torch.optim.Optimizer] = {}
        for each in optimizers:
            if each is not None:
                held.update((id(inner), inner) for inner in wrapped_optimizers(each))
        snap.optimizers = [OptimizerState.capture(each) for each in held.values()]
        return snap

    def set_gradients_aside(self) -> None:
        """Drop the gradients for a trial (a real step starts with zero_grad); restore brings them back."""
        for parameter, _ in self.grads:
            parameter.grad = None

    def restore(self, *, gradients: bool = True, scales: bool = True) -> None:
        """Put everything back; with ``gradients=False`` the gradients stay set aside, and with
        ``scales=False`` the GradScalers keep the scale they have reached (between trials: once a
        trial's steps were skipped for overflow and the scale came down, the next trial's steps
        run the optimizer, whose state is part of what a step needs)."""
        # An FSDP2 module a step left gathered registers its shards again before they are restored.
        reshard(self.model)
        for slot in self.slots:
            slot.restore()
        for module, training in self.modes:
            module.training = training
        for parameter, saved in self.grads:
            if gradients and saved is not None:
                parameter.grad = saved.to(parameter.device, copy=True)
            else:
                parameter.grad = None
        for parameter, saved in self.other_grads:
            parameter.grad = None if saved is None else saved.to(parameter.device, copy=True)
        for optimizer in self.optimizers:
            optimizer.restore()
        for scaler in self.scalers:
            scaler.restore(scale=scales)
        for scheduler in self.schedulers:
            scheduler.restore()
        if self.rng is not None:
            self.rng.restore()

"""Snapshot and restore of everything a trial may change: weights, gradients, optimizer, RNG, modes.

Tensors are restored in place (the user's ``Parameter`` and buffer objects stay the same objects)
from copies kept on the CPU, so the copies take no device memory while trials run.
"""

from __future__ import annotations

import copy
import random
import sys
from dataclasses import dataclass, field
from typing import Any

import torch


def _host_copy(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().to("cpu", copy=True)


@dataclass
class _TensorSlot:
    """One named tensor of a module (``_parameters`` or ``_buffers``) and its saved value."""

    table: dict[str, Any]
    name: str
    original: torch.Tensor
    saved: torch.Tensor

    def restore(self) -> None:
        with torch.no_grad():
            self.original.copy_(self.saved)
        self.table[self.name] = self.original


@dataclass
class _RngState:
    torch_cpu: torch.Tensor
    python: Any
    cuda: list[torch.Tensor] | None
    numpy: Any

    @classmethod
    def capture(cls) -> _RngState:
        cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
        numpy_module = sys.modules.get("numpy")
        numpy_state = numpy_module.random.get_state() if numpy_module is not None else None
        return cls(torch.get_rng_state(), random.getstate(), cuda, numpy_state)

    def restore(self) -> None:
        torch.set_rng_state(self.torch_cpu)
        random.setstate(self.python)
        if self.cuda is not None:
            torch.cuda.set_rng_state_all(self.cuda)
        numpy_module = sys.modules.get("numpy")
        if self.numpy is not None and numpy_module is not None:
            numpy_module.random.set_state(self.numpy)


@dataclass
class TrainingSnapshot:
    """The state of a model and optimizer at one moment; ``restore`` puts it back bit for bit."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer | None
    slots: list[_TensorSlot] = field(default_factory=list)
    grads: list[tuple[torch.nn.Parameter, torch.Tensor | None]] = field(default_factory=list)
    modes: list[tuple[torch.nn.Module, bool]] = field(default_factory=list)
    optimizer_state: dict[Any, dict[str, Any]] = field(default_factory=dict)
    optimizer_originals: dict[Any, dict[str, Any]] = field(default_factory=dict)
    param_groups: list[dict[str, Any]] = field(default_factory=list)
    rng: _RngState | None = None

    @classmethod
    def capture(cls, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> TrainingSnapshot:
        snap = cls(model=model, optimizer=optimizer, rng=_RngState.capture())
        for module in model.modules():
            snap.modes.append((module, module.training))
            for table in (module._parameters, module._buffers):
                for name, tensor in table.items():
                    if tensor is not None:
                        snap.slots.append(_TensorSlot(table, name, tensor, _host_copy(tensor)))
        for parameter in model.parameters():
            grad = parameter.grad
            snap.grads.append((parameter, None if grad is None else _host_copy(grad)))
        if optimizer is not None:
            for key, state in optimizer.state.items():
                snap.optimizer_originals[key] = dict(state)
                snap.optimizer_state[key] = {
                    name: _host_copy(value) if isinstance(value, torch.Tensor) else copy.deepcopy(value)
                    for name, value in state.items()
                }
            snap.param_groups = [
                {name: copy.deepcopy(value) for name, value in group.items() if name != "params"}
                for group in optimizer.param_groups
            ]
        return snap

    def set_gradients_aside(self) -> None:
        """Drop the gradients for a trial (a real step starts with zero_grad); restore brings them back."""
        for parameter, _ in self.grads:
            parameter.grad = None

    def restore(self, *, gradients: bool = True) -> None:
        """Put everything back; with ``gradients=False`` the gradients stay set aside."""
        for slot in self.slots:
            slot.restore()
        for module, training in self.modes:
            module.training = training
        for parameter, saved in self.grads:
            if gradients and saved is not None:
                parameter.grad = saved.to(parameter.device, copy=True)
            else:
                parameter.grad = None
        if self.optimizer is not None:
            self._restore_optimizer(self.optimizer)
        if self.rng is not None:
            self.rng.restore()

    def _restore_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        for key in list(optimizer.state.keys()):
            if key not in self.optimizer_originals:
                del optimizer.state[key]
        for key, originals in self.optimizer_originals.items():
            state = optimizer.state[key]
            state.clear()
            for name, original in originals.items():
                saved = self.optimizer_state[key][name]
                if isinstance(original, torch.Tensor):
                    with torch.no_grad():
                        original.copy_(saved)
                    state[name] = original
                else:
                    state[name] = copy.deepcopy(saved)
        for group, saved_group in zip(optimizer.param_groups, self.param_groups, strict=True):
            for name, value in saved_group.items():
                group[name] = copy.deepcopy(value)

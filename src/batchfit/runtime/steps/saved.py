"""The pieces of a snapshot, each saved on the host and put back in place: a module's tensor, an
optimizer's state, the RNGs, a GradScaler, a learning-rate scheduler."""

from __future__ import annotations

import copy
import random
import sys
import weakref
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._pytree import tree_map


def host_copy(tensor: torch.Tensor) -> torch.Tensor:
    """A copy of ``tensor`` on the host, detached: what a restore copies back from."""
    return tensor.detach().to("cpu", copy=True)


@dataclass(frozen=True)
class _OnHost:
    """A tensor of optimizer state, saved on the host; ``back`` makes it anew on its device."""

    saved: torch.Tensor
    device: torch.device

    def back(self) -> torch.Tensor:
        return self.saved.to(self.device, copy=True)


def _save_state_value(value: Any) -> Any:
    """A value of optimizer state saved: its tensors (also in lists, tuples and dicts: L-BFGS's
    history) on the host, so that the device holds no second copy during the trials."""
    return tree_map(
        lambda leaf: (
            _OnHost(host_copy(leaf), leaf.device) if isinstance(leaf, torch.Tensor) else copy.deepcopy(leaf)
        ),
        value,
    )


def _restored_state_value(saved: Any) -> Any:
    return tree_map(lambda leaf: leaf.back() if isinstance(leaf, _OnHost) else copy.deepcopy(leaf), saved)


@dataclass
class TensorSlot:
    """One named tensor of a module (``_parameters`` or ``_buffers``) and its value saved on the
    host. The tensor itself is held weakly: a buffer the step assigns anew (a queue, a running
    statistic computed out of place) is freed as in training, not kept beside its successor.
    (Parameters stay alive: the snapshot's gradient list holds them, as the optimizer does.)"""

    table: dict[str, Any]
    name: str
    original: weakref.ref[torch.Tensor]
    saved: torch.Tensor
    device: torch.device

    @classmethod
    def of(cls, table: dict[str, Any], name: str, tensor: torch.Tensor) -> TensorSlot:
        return cls(table, name, weakref.ref(tensor), host_copy(tensor), tensor.device)

    def restore(self) -> None:
        original = self.original()
        if original is None:  # a buffer the step replaced, and nothing else held: made anew
            original = self.saved.to(self.device, copy=True)
            self.original = weakref.ref(original)
        else:
            with torch.no_grad():
                original.copy_(self.saved)
        self.table[self.name] = original


@dataclass
class RngState:
    torch_cpu: torch.Tensor
    python: Any
    cuda: list[torch.Tensor] | None
    numpy: Any

    @classmethod
    def capture(cls) -> RngState:
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
class ScalerState:
    """One GradScaler's state: its scale and growth tracker (None until its first step) and the
    rest of its attributes; ``restore`` puts them back, the tensor objects in place."""

    scaler: torch.amp.GradScaler
    tensors: dict[str, tuple[torch.Tensor, torch.Tensor] | None]
    others: dict[str, Any]

    @classmethod
    def capture(cls, scaler: torch.amp.GradScaler) -> ScalerState:
        tensors: dict[str, tuple[torch.Tensor, torch.Tensor] | None] = {}
        others: dict[str, Any] = {}
        for name, value in vars(scaler).items():
            if name in ("_scale", "_growth_tracker"):
                tensors[name] = None if value is None else (value, host_copy(value))
            else:
                others[name] = copy.deepcopy(value)
        return cls(scaler, tensors, others)

    def restore(self, *, scale: bool = True) -> None:
        """Put the scaler back; with ``scale=False`` only its bookkeeping within a step (a step cut
        short by an out-of-memory leaves it half done), keeping the scale it has reached."""
        attributes = vars(self.scaler)
        if not scale:
            if "_per_optimizer_states" in self.others:
                attributes["_per_optimizer_states"] = copy.deepcopy(self.others["_per_optimizer_states"])
            return
        for name in [name for name in attributes if name not in self.tensors and name not in self.others]:
            del attributes[name]
        for name, value in self.others.items():
            attributes[name] = copy.deepcopy(value)
        for name, saved in self.tensors.items():
            if saved is None:
                attributes[name] = None
                continue
            original, host = saved
            with torch.no_grad():
                original.copy_(host)
            attributes[name] = original


@dataclass
class SchedulerState:
    """One learning-rate scheduler's state (its epoch, step count, last rates)."""

    scheduler: torch.optim.lr_scheduler.LRScheduler
    saved: dict[str, Any]

    @classmethod
    def capture(cls, scheduler: torch.optim.lr_scheduler.LRScheduler) -> SchedulerState:
        return cls(scheduler, copy.deepcopy(scheduler.state_dict()))

    def restore(self) -> None:
        self.scheduler.load_state_dict(copy.deepcopy(self.saved))


@dataclass
class OptimizerState:
    """One optimizer's state: its per-parameter state (tensors on the host, the originals held
    weakly: one a step replaces, L-BFGS's direction, is freed as in training; one still alive at
    restore is filled in place, so references to it stay good) and its groups' settings."""

    optimizer: torch.optim.Optimizer
    state: dict[Any, dict[str, Any]]
    originals: dict[Any, dict[str, weakref.ref[torch.Tensor]]]
    param_groups: list[dict[str, Any]]

    @classmethod
    def capture(cls, optimizer: torch.optim.Optimizer) -> OptimizerState:
        originals = {
            key: {
                name: weakref.ref(value) for name, value in state.items() if isinstance(value, torch.Tensor)
            }
            for key, state in optimizer.state.items()
        }
        saved = {
            key: {name: _save_state_value(value) for name, value in state.items()}
            for key, state in optimizer.state.items()
        }
        groups = [
            {name: copy.deepcopy(value) for name, value in group.items() if name != "params"}
            for group in optimizer.param_groups
        ]
        return cls(optimizer, saved, originals, groups)

    def restore(self) -> None:
        optimizer = self.optimizer
        for key in list(optimizer.state.keys()):
            if key not in self.state:
                del optimizer.state[key]
        for key, saved_state in self.state.items():
            originals = self.originals[key]
            state = optimizer.state[key]
            state.clear()
            for name, saved in saved_state.items():
                original = originals[name]() if name in originals else None
                if original is not None and isinstance(saved, _OnHost):
                    with torch.no_grad():
                        original.copy_(saved.saved)
                    state[name] = original
                else:
                    state[name] = _restored_state_value(saved)
        for group, saved_group in zip(optimizer.param_groups, self.param_groups, strict=True):
            for name, value in saved_group.items():
                group[name] = copy.deepcopy(value)

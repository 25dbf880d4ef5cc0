"""Snapshot and restore of everything a trial may change: weights, gradients, optimizer, RNG,
modes, and the GradScalers and learning-rate schedulers the training step uses.

Tensors are restored in place (the user's ``Parameter`` and buffer objects stay the same objects)
from copies kept on the CPU, so the copies take no device memory while trials run.
"""

from __future__ import annotations

import copy
import functools
import inspect
import itertools
import random
import sys
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._pytree import tree_map

from batchfit.runtime.devices.tracker import wrapped_optimizers
from batchfit.runtime.distributed.sharded import reshard

#: How far ``reachable`` follows references from a step: the step's closure, defaults and
#: globals, then the attributes of what it finds there (``self.scaler`` of a trainer object).
SEARCH_DEPTH = 3
#: The items of a list, tuple or dict it looks into: a scaler is held by name, not as the
#: millionth item of a dataset's file list, which would cost seconds to walk.
CONTAINER_ITEMS = 64


def _host_copy(tensor: torch.Tensor) -> torch.Tensor:
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
            _OnHost(_host_copy(leaf), leaf.device) if isinstance(leaf, torch.Tensor) else copy.deepcopy(leaf)
        ),
        value,
    )


def _restored_state_value(saved: Any) -> Any:
    return tree_map(lambda leaf: leaf.back() if isinstance(leaf, _OnHost) else copy.deepcopy(leaf), saved)


@dataclass
class _TensorSlot:
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
    def of(cls, table: dict[str, Any], name: str, tensor: torch.Tensor) -> _TensorSlot:
        return cls(table, name, weakref.ref(tensor), _host_copy(tensor), tensor.device)

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


def grad_scalers(*steps: Callable[..., Any] | None) -> list[torch.amp.GradScaler]:
    """The GradScalers that ``steps`` (a workload's ``train_step`` and ``eval_step``) reach (see
    ``reachable``). A scaler's scale changes as steps run (and a fake-tensor trace would leave fake
    tensors in it), so a trial must put it back as it puts back the optimizer."""
    return reachable(steps, torch.amp.GradScaler)


def lr_schedulers(*steps: Callable[..., Any] | None) -> list[torch.optim.lr_scheduler.LRScheduler]:
    """The learning-rate schedulers that ``steps`` reach: a step that calls ``scheduler.step()``
    moves the schedule on at every trial."""
    return reachable(steps, torch.optim.lr_scheduler.LRScheduler)


def reachable(steps: Iterable[Callable[..., Any] | None], kind: type[Any]) -> list[Any]:
    """The objects of type ``kind`` that ``steps`` reach: through closures, ``functools.partial``,
    bound methods and callable objects, default arguments, and the module globals the step's
    code names, then one level into the objects found there."""
    return reachable_where(steps, lambda value: isinstance(value, kind))


def reachable_where(steps: Iterable[Any], wanted: Callable[[Any], bool]) -> list[Any]:
    """The objects ``steps`` reach (as ``reachable`` follows them) for which ``wanted`` is true;
    one that is wanted is not looked into, and neither is a tensor, a module or a class."""
    found: dict[int, Any] = {}
    seen: set[int] = set()

    def visit(value: Any, depth: int) -> None:
        if wanted(value):
            found.setdefault(id(value), value)
            return
        if depth <= 0 or id(value) in seen or isinstance(value, (torch.Tensor, torch.nn.Module, type)):
            return
        seen.add(id(value))
        for inner in _references(value):
            visit(inner, depth - 1)

    for step in steps:
        if step is not None:
            visit(step, SEARCH_DEPTH)
    return list(found.values())


def _references(value: Any) -> Iterable[Any]:
    """What ``value`` holds that a step could reach a GradScaler through."""
    if isinstance(value, functools.partial):
        return [value.func, *value.args, *value.keywords.values()]
    if inspect.ismethod(value):
        return [value.__self__, value.__func__]
    if inspect.isfunction(value):
        cells = [cell.cell_contents for cell in value.__closure__ or () if _filled(cell)]
        names = value.__code__.co_names
        named = [value.__globals__[name] for name in names if name in value.__globals__]
        return [*cells, *(value.__defaults__ or ()), *(value.__kwdefaults__ or {}).values(), *named]
    if isinstance(value, dict):
        return list(itertools.islice(value.values(), CONTAINER_ITEMS))
    if isinstance(value, (list, tuple)):
        return list(value[:CONTAINER_ITEMS])
    if isinstance(value, (str, bytes, int, float, complex, bool)):
        return []
    if inspect.ismodule(value) or inspect.isbuiltin(value):
        return []
    attributes = getattr(value, "__dict__", None)
    return list(attributes.values()) if isinstance(attributes, dict) else []


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018 (an empty cell raises)
    except ValueError:
        return False
    return True


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
                tensors[name] = None if value is None else (value, _host_copy(value))
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


def step_state(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    steps: Iterable[Callable[..., Any] | None],
) -> list[torch.nn.Module | torch.optim.Optimizer]:
    """The modules and optimizers ``steps`` reach (as ``reachable`` finds them) besides ``model`` and
    ``optimizer``: a GAN's discriminator and its optimizer, an EMA copy the step updates, a
    teacher. A step changes them as it changes the model, and they hold memory beside it. A module
    counts where it holds a parameter or buffer the model does not (a wrapper of the model, a
    compiled one, or a submodule of it does not)."""
    own = {id(tensor) for tensor in (*model.parameters(), *model.buffers())}

    def other(value: Any) -> bool:
        if isinstance(value, torch.optim.Optimizer):
            return value is not optimizer
        if isinstance(value, torch.nn.Module):
            return any(id(tensor) not in own for tensor in (*value.parameters(), *value.buffers()))
        return False

    return reachable_where(steps, other)


@dataclass
class _OptimizerState:
    """One optimizer's state: its per-parameter state (tensors on the host, the originals held
    weakly: one a step replaces, L-BFGS's direction, is freed as in training; one still alive at
    restore is filled in place, so references to it stay good) and its groups' settings."""

    optimizer: torch.optim.Optimizer
    state: dict[Any, dict[str, Any]]
    originals: dict[Any, dict[str, weakref.ref[torch.Tensor]]]
    param_groups: list[dict[str, Any]]

    @classmethod
    def capture(cls, optimizer: torch.optim.Optimizer) -> _OptimizerState:
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


@dataclass
class TrainingSnapshot:
    """The state of a model and optimizer at one moment, and of the modules and optimizers the
    steps reach beside them (``step_state``); ``restore`` puts it back bit for bit."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer | None
    slots: list[_TensorSlot] = field(default_factory=list)
    grads: list[tuple[torch.nn.Parameter, torch.Tensor | None]] = field(default_factory=list)
    # The other modules' gradients: a trial does not set them aside (they are the user's to
    # zero), but every restore puts them back.
    other_grads: list[tuple[torch.nn.Parameter, torch.Tensor | None]] = field(default_factory=list)
    modes: list[tuple[torch.nn.Module, bool]] = field(default_factory=list)
    optimizers: list[_OptimizerState] = field(default_factory=list)
    rng: _RngState | None = None
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
        snap = cls(model=model, optimizer=optimizer, rng=_RngState.capture())
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
                        snap.slots.append(_TensorSlot.of(table, name, tensor))
        own = {id(parameter) for parameter in model.parameters()}
        for parameter in model.parameters():
            grad = parameter.grad
            snap.grads.append((parameter, None if grad is None else _host_copy(grad)))
        for owner in modules[1:]:
            for parameter in owner.parameters():
                if id(parameter) not in own:
                    own.add(id(parameter))
                    grad = parameter.grad
                    snap.other_grads.append((parameter, None if grad is None else _host_copy(grad)))
        optimizers = [optimizer, *(other for other in others if isinstance(other, torch.optim.Optimizer))]
        held: dict[int, torch.optim.Optimizer] = {}
        for each in optimizers:
            if each is not None:
                held.update((id(inner), inner) for inner in wrapped_optimizers(each))
        snap.optimizers = [_OptimizerState.capture(each) for each in held.values()]
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

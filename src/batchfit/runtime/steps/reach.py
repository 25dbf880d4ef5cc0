"""What a workload's steps reach besides the model and optimizer: the GradScalers, learning-rate
schedulers, modules and optimizers found through their closures, defaults, globals and attributes."""

from __future__ import annotations

import functools
import inspect
import itertools
from collections.abc import Callable, Iterable
from typing import Any

import torch

#: How far ``reachable`` follows references from a step: the step's closure, defaults and
#: globals, then the attributes of what it finds there (``self.scaler`` of a trainer object).
SEARCH_DEPTH = 3
#: The items of a list, tuple or dict it looks into: a scaler is held by name, not as the
#: millionth item of a dataset's file list, which would cost seconds to walk.
CONTAINER_ITEMS = 64


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

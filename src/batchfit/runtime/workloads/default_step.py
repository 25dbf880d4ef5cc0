"""The default step: its loss (``loss_fn`` on the model's output, or the model's own loss) and the
optimizer's step, with the closure an optimizer such as L-BFGS asks for."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from batchfit.errors import ConfigurationError


def needs_closure(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer.step`` must be given a closure that recomputes the loss (L-BFGS: it
    evaluates the loss several times per step), rather than taking one as an option. Asked at
    every step: read once per optimizer class (a signature takes 10 us), unless the instance has
    a step of its own."""
    own = vars(optimizer).get("step")
    if own is not None:
        return _requires_closure(own)
    cls: type = type(optimizer)
    if cls not in _CLASS_NEEDS_CLOSURE:
        _CLASS_NEEDS_CLOSURE[cls] = _requires_closure(optimizer.step)
    return _CLASS_NEEDS_CLOSURE[cls]


_CLASS_NEEDS_CLOSURE: dict[type, bool] = {}


def _requires_closure(step: Callable[..., Any]) -> bool:
    closure = inspect.signature(step).parameters.get("closure")
    return closure is not None and closure.default is inspect.Parameter.empty


def check_steps_on_gradients(optimizer: torch.optim.Optimizer, owner: str) -> None:
    """A ConfigurationError where ``owner``, which steps ``optimizer`` on gradients it accumulated,
    is given one that needs a closure (``needs_closure``)."""
    if needs_closure(optimizer):
        raise ConfigurationError(
            f"{owner} steps the optimizer once on the gradients its micro-batches accumulated, but "
            f"{type(optimizer).__name__}.step needs a closure that recomputes the loss; use an optimizer "
            f"that steps on gradients (SGD, AdamW, ...), or step {type(optimizer).__name__} on the whole "
            f"batch yourself."
        )


def optimizer_step(
    optimizer: torch.optim.Optimizer, loss: Callable[[], torch.Tensor], *, times: int = 1
) -> None:
    """One training step of ``optimizer``: gradients cleared, ``times`` backwards of ``loss()``
    (each scaled by ``1 / times``: gradient accumulation), then the update. An optimizer that
    needs a closure (``needs_closure``) gets one that does the clearing and backwards, as often as
    it asks."""

    def backward(read: bool) -> float:
        """Clear the gradients and run the backwards; the mean loss where ``read`` (the closure's
        value: reading it waits for the device, so only an optimizer that asks for it does)."""
        optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for _ in range(times):
            value = loss()
            (value / times if times > 1 else value).backward()
            total += float(value.detach()) / times if read else 0.0
        return total

    if needs_closure(optimizer):
        optimizer.step(functools.partial(backward, True))
    else:
        backward(False)
        optimizer.step()


#: What a loss that is not a scalar tensor is told to be.
SCALAR_LOSS = (
    "reduce it (reduction='mean', as nn.CrossEntropyLoss does by default) and keep it a tensor "
    "(not .item() or float()): backward starts from it."
)


def scalar_loss(value: Any, source: str, hint: str = SCALAR_LOSS) -> torch.Tensor:
    """``value`` where it is a scalar tensor, else a ConfigurationError naming ``source`` (the
    function that returned it), what it returned, and ``hint``."""
    if isinstance(value, torch.Tensor) and value.dim() == 0:
        return value
    found = (
        f"a tensor of shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) else type(value).__name__
    )
    raise ConfigurationError(f"{source} returned {found}, not a scalar loss; {hint}")


def model_loss(
    model: torch.nn.Module,
    batch: Any,
    loss_fn: Callable[[Any, Any], torch.Tensor] | None,
    *,
    owner: str = "Workload",
    custom: str = "train_step",
    hint: str = SCALAR_LOSS,
) -> torch.Tensor:
    """The default step's loss: ``loss_fn(model(inputs), target)`` on a batch ``(inputs, target)``,
    else the model's output (or its ``.loss``/``["loss"]``). Errors name ``owner(loss_fn=...)`` and
    ``custom=...``, the parameters that replace this default; a ``loss_fn`` that returns no scalar
    tensor is told ``hint``."""
    if loss_fn is not None:
        if not (isinstance(batch, Sequence) and len(batch) == 2):
            raise ConfigurationError(
                f"with loss_fn, a batch must be a pair (inputs, target), got "
                f"{type(batch).__name__}; pass {custom}=... for other layouts."
            )
        inputs, target = batch
        return scalar_loss(loss_fn(call_model(model, inputs), target), "loss_fn", hint)
    output = call_model(model, batch)
    loss = output.get("loss") if isinstance(output, dict) else getattr(output, "loss", output)
    if not (isinstance(loss, torch.Tensor) and loss.dim() == 0):
        raise ConfigurationError(
            f"the model returned {type(output).__name__}, not a scalar loss; pass "
            f"{owner}(loss_fn=...) or {custom}=... so batchfit can compute one."
        )
    return loss


def call_model(model: torch.nn.Module, inputs: Any) -> Any:
    """``model`` called on ``inputs`` as a batch holds them: keywords, positional, or one argument."""
    if isinstance(inputs, Mapping):
        return model(**inputs)
    if isinstance(inputs, (tuple, list)):
        return model(*inputs)
    return model(inputs)

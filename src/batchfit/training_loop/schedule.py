"""Ready helpers for the training loop: a warm-up learning-rate schedule and gradient accumulation that is
right under DistributedDataParallel. Both count optimizer steps, one per accumulation_steps micro-batches.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Literal

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.optim.lr_scheduler import LambdaLR, LRScheduler

from batchfit.errors import ConfigurationError
from batchfit.runtime.workloads.default_step import check_steps_on_gradients

if TYPE_CHECKING:
    from torch.amp import GradScaler

Decay = Literal["constant", "cosine", "linear"]
DECAYS: tuple[Decay, ...] = ("constant", "cosine", "linear")


def warmup_schedule(
    optimizer: torch.optim.Optimizer,
    *,
    warmup_steps: int,
    total_steps: int | None = None,
    decay: Decay = "constant",
) -> LambdaLR:
    """Linear warm-up to each param group's lr, then constant, or cosine or linear decay to 0 at total_steps.

    The optimizer's lr is the peak: set it to the scaled lr for the global batch size. Optimizer step i
    (0-based) uses lr x (i + 1) / warmup_steps while i < warmup_steps, so no step is wasted at lr 0 and
    step warmup_steps - 1 runs at the full lr. The decay then runs from the full lr at step warmup_steps to
    0 at step total_steps. Call `scheduler.step()` once per optimizer step (GradientAccumulator does).
    """
    if warmup_steps < 0:
        raise ConfigurationError(f"warmup_steps ({warmup_steps}) must be 0 or more; 0 starts at the full lr.")
    if decay not in DECAYS:
        raise ConfigurationError(f"decay ({decay!r}) must be one of 'constant', 'cosine', 'linear'.")
    if total_steps is None and decay != "constant":
        raise ConfigurationError(
            f"decay={decay!r} needs total_steps, the run's length in optimizer steps, where the lr reaches 0."
        )
    if total_steps is not None and total_steps < warmup_steps:
        raise ConfigurationError(
            f"total_steps ({total_steps}) must be at least warmup_steps ({warmup_steps}); both count "
            f"optimizer steps, not micro-steps (one optimizer step per accumulation_steps micro-batches)."
        )

    return LambdaLR(
        optimizer,
        functools.partial(lr_factor, warmup_steps=warmup_steps, total_steps=total_steps, decay=decay),
    )


def lr_factor(
    step: int, *, warmup_steps: int, total_steps: int | None = None, decay: Decay = "constant"
) -> float:
    """The share of the peak lr at optimizer step ``step`` (0-based) under ``warmup_schedule``."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if decay == "constant" or total_steps is None:
        return 1.0
    if step >= total_steps:
        return 0.0
    progress = (step - warmup_steps) / (total_steps - warmup_steps)  # 0 at the peak, 1 at total_steps
    return 0.5 * (1.0 + math.cos(math.pi * progress)) if decay == "cosine" else 1.0 - progress


class GradientAccumulator:
    """Steps the optimizer, then the scheduler, once every `accumulation_steps` micro-steps.

    Each micro-step's loss (a mean over its micro-batch) is backpropagated divided by accumulation_steps, so
    the accumulated gradient is the mean over micro_batch_size x accumulation_steps samples; DDP averages it
    over world_size. Under DistributedDataParallel every micro-step but the last runs in `model.no_sync()`,
    so gradients are all-reduced once per optimizer step. A plain model just accumulates.

        accumulator = GradientAccumulator(model, optimizer, accumulation_steps=4, scheduler=scheduler)
        for inputs, targets in loader:
            with accumulator.micro_step():          # forward and backward both inside
                accumulator.backward(loss_fn(model(inputs), targets))
            if accumulator.optimizer_stepped:
                ema.update(model)                   # once per optimizer step

    On the last micro-step the optimizer steps when the `with` block exits: gradients are clipped to
    `max_grad_norm` (after unscaling, with a GradScaler), the optimizer and scheduler step, and the gradients
    are set to None. A micro-step whose block raises is not counted and steps nothing. Micro-steps left over
    at the end of an epoch carry into the next one's accumulation. The gradients are zeroed on construction.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        accumulation_steps: int,
        *,
        scheduler: LRScheduler | None = None,
        scaler: GradScaler | None = None,
        max_grad_norm: float | None = None,
    ) -> None:
        if accumulation_steps < 1:
            raise ConfigurationError(
                f"accumulation_steps ({accumulation_steps}) must be 1 or more; 1 steps the optimizer after "
                f"every micro-batch."
            )
        if max_grad_norm is not None and max_grad_norm <= 0:
            raise ConfigurationError(f"max_grad_norm ({max_grad_norm}) must be positive; None does not clip.")
        check_steps_on_gradients(optimizer, type(self).__name__)
        self.model = model
        self.optimizer = optimizer
        self.accumulation_steps = accumulation_steps
        self.scheduler = scheduler
        self.scaler = scaler
        self.max_grad_norm = max_grad_norm
        self.micro_steps = 0  # completed micro-steps
        self.optimizer_steps = 0
        self._stepped = False
        optimizer.zero_grad(set_to_none=True)

    @property
    def is_last_micro_step(self) -> bool:
        """Whether the current micro-step (between micro-steps: the next one) all-reduces and steps."""
        return self.micro_steps % self.accumulation_steps == self.accumulation_steps - 1

    @property
    def optimizer_stepped(self) -> bool:
        """Whether the micro-step that just ended stepped the optimizer: the place for an EMA update."""
        return self._stepped

    @contextlib.contextmanager
    def micro_step(self) -> Iterator[None]:
        """One forward and backward; under DDP in `no_sync()` unless it is the last of the accumulation."""
        last = self.is_last_micro_step
        sync: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
        if not last and isinstance(self.model, DistributedDataParallel):
            sync = self.model.no_sync()
        self._stepped = False
        with sync:
            yield
        self.micro_steps += 1
        if last:
            self._step()

    def backward(self, loss: torch.Tensor) -> None:
        """Backward of `loss / accumulation_steps`, scaled by the GradScaler if there is one."""
        loss = loss / self.accumulation_steps
        if self.scaler is not None:
            loss = self.scaler.scale(loss)
        loss.backward()

    def _step(self) -> None:
        step_optimizer(self.optimizer, self.model.parameters(), self.scaler, self.max_grad_norm)
        if self.scheduler is not None:
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.optimizer_steps += 1
        self._stepped = True


def step_optimizer(
    optimizer: torch.optim.Optimizer,
    parameters: Iterable[nn.Parameter],
    scaler: GradScaler | None,
    max_grad_norm: float | None,
) -> None:
    """One optimizer step on accumulated gradients: unscaled first when they are clipped to
    ``max_grad_norm``, through the GradScaler when there is one."""
    if max_grad_norm is not None:
        if scaler is not None:
            scaler.unscale_(optimizer)
        nn.utils.clip_grad_norm_(parameters, max_grad_norm)
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()

"""What ``MicroBatchStep`` accepts, checked once when it is made: a module, an optimizer that steps
on gradients, one way to compute the loss, a GradScaler, a scheduler stepped without arguments, no FSDP
(``MicroBatchOptions`` checks its own fields)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from batchfit.errors import ArgumentTypeError, ConfigurationError
from batchfit.runtime.distributed.sharded import is_fully_sharded
from batchfit.runtime.workloads.default_step import check_steps_on_gradients


def check_arguments(
    model: Any,
    optimizer: Any,
    *,
    loss_fn: Any,
    compute_loss: Any,
    scaler: Any,
    scheduler: Any,
) -> None:
    if not isinstance(model, nn.Module):
        raise ArgumentTypeError(
            f"model must be a torch.nn.Module, got {type(model).__name__}; pass the module you train "
            f"(under DDP, its DistributedDataParallel wrapper)."
        )
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise ArgumentTypeError(
            f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}; MicroBatchStep "
            f"steps it once per call."
        )
    check_steps_on_gradients(optimizer, "MicroBatchStep")
    if loss_fn is not None and compute_loss is not None:
        raise ConfigurationError(
            "pass loss_fn or compute_loss, not both: compute_loss(model, micro_batch) computes the loss "
            "itself, loss_fn(model(inputs), target) on a batch (inputs, target)."
        )
    if loss_fn is not None and not callable(loss_fn):
        raise ArgumentTypeError(
            f"loss_fn must be callable, got {type(loss_fn).__name__}; pass loss_fn(output, target) -> a "
            f"scalar loss, such as torch.nn.functional.cross_entropy or nn.CrossEntropyLoss()."
        )
    if compute_loss is not None and not callable(compute_loss):
        raise ArgumentTypeError(
            f"compute_loss must be callable, got {type(compute_loss).__name__}; pass "
            f"compute_loss(model, micro_batch) -> a scalar loss."
        )
    _check_helpers(scaler, scheduler)
    if is_fully_sharded(model):
        raise ConfigurationError(
            "MicroBatchStep does not run FSDP models: their backward runs collectives, so a rank that ran "
            "out of memory there would leave the others waiting. Use DistributedDataParallel."
        )


def _check_helpers(scaler: Any, scheduler: Any) -> None:
    """The scaler and scheduler are what MicroBatchStep calls them as, or None."""
    if scaler is not None and not isinstance(scaler, torch.amp.GradScaler):
        raise ConfigurationError(
            f"scaler must be a torch.amp.GradScaler or None, got {type(scaler).__name__}; pass the "
            f"GradScaler that scales your float16 training, or None."
        )
    if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
        raise ConfigurationError(
            "scheduler is a ReduceLROnPlateau, whose step needs the metric it watches, and MicroBatchStep "
            "steps its scheduler without arguments after each optimizer step; pass scheduler=None and "
            "call scheduler.step(metric) yourself."
        )
    if scheduler is not None and not isinstance(scheduler, torch.optim.lr_scheduler.LRScheduler):
        raise ConfigurationError(
            f"scheduler must be a torch.optim.lr_scheduler.LRScheduler or None, got "
            f"{type(scheduler).__name__}; pass the scheduler of the optimizer, stepped once per optimizer "
            f"step, or None."
        )

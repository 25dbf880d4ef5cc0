"""What ``MicroBatchStep`` accepts, checked once when it is made: a module, an optimizer that steps
on gradients, one way to compute the loss, a GradScaler, a scheduler stepped without arguments, a
positive clipping norm, a batch dimension, a noise-scale monitor, a non-finite policy, no FSDP."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from batchfit.errors import ArgumentTypeError, ConfigurationError
from batchfit.policy.noise_monitor import NoiseScaleMonitor
from batchfit.runtime.distributed.sharded import is_fully_sharded
from batchfit.runtime.steps.micro_batch_finite import NON_FINITE
from batchfit.runtime.workloads.default_step import check_steps_on_gradients


def check_arguments(
    model: Any,
    optimizer: Any,
    *,
    loss_fn: Any,
    compute_loss: Any,
    scaler: Any,
    scheduler: Any,
    max_grad_norm: Any,
    batch_dim: Any,
    noise_scale: Any,
    non_finite: Any,
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
    _check_helpers(scaler, scheduler, noise_scale)
    if max_grad_norm is not None and (
        isinstance(max_grad_norm, bool) or not isinstance(max_grad_norm, (int, float))
    ):
        raise ArgumentTypeError(
            f"max_grad_norm must be a number or None, got {type(max_grad_norm).__name__} "
            f"({max_grad_norm!r}); pass the norm to clip the gradients to, such as 1.0, or None not to clip."
        )
    if max_grad_norm is not None and not max_grad_norm > 0:
        raise ConfigurationError(f"max_grad_norm ({max_grad_norm}) must be positive; None does not clip.")
    if isinstance(batch_dim, bool) or not isinstance(batch_dim, int) or batch_dim < 0:
        raise ConfigurationError(
            f"batch_dim ({batch_dim!r}) must be 0 or more: the dimension of the batch's tensors that "
            f"holds the samples."
        )
    if is_fully_sharded(model):
        raise ConfigurationError(
            "MicroBatchStep does not run FSDP models: their backward runs collectives, so a rank that ran "
            "out of memory there would leave the others waiting. Use DistributedDataParallel."
        )
    if non_finite not in NON_FINITE:
        raise ConfigurationError(
            f"non_finite ({non_finite!r}) must be 'raise' (a NonFiniteError when a loss or gradient is "
            f"NaN or inf) or 'skip' (drop that step's gradients and step nothing, as a GradScaler does)."
        )


def _check_helpers(scaler: Any, scheduler: Any, noise_scale: Any) -> None:
    """The scaler, scheduler and monitor are what MicroBatchStep calls them as, or None."""
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
    if noise_scale is not None and not isinstance(noise_scale, NoiseScaleMonitor):
        raise ConfigurationError(
            f"noise_scale must be a batchfit.policy.noise_monitor.NoiseScaleMonitor or None, got "
            f"{type(noise_scale).__name__}; pass NoiseScaleMonitor(every=100) to log the gradient noise "
            f"scale, or None."
        )

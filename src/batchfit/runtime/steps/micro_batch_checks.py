"""What ``MicroBatchStep`` accepts, checked once when it is made: a module, an optimizer that steps
on gradients, one way to compute the loss, a positive clipping norm, a batch dimension, no FSDP."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from batchfit.errors import ConfigurationError
from batchfit.runtime.distributed.sharded import is_fully_sharded
from batchfit.runtime.workloads.default_step import check_steps_on_gradients


def check_arguments(
    model: Any,
    optimizer: Any,
    loss_fn: Any,
    compute_loss: Any,
    max_grad_norm: float | None,
    batch_dim: Any,
) -> None:
    if not isinstance(model, nn.Module):
        raise ConfigurationError(f"model must be a torch.nn.Module, got {type(model).__name__}.")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise ConfigurationError(
            f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}; MicroBatchStep "
            f"steps it once per call."
        )
    check_steps_on_gradients(optimizer, "MicroBatchStep")
    if loss_fn is not None and compute_loss is not None:
        raise ConfigurationError(
            "pass loss_fn or compute_loss, not both: compute_loss(model, micro_batch) computes the loss "
            "itself, loss_fn(model(inputs), target) on a batch (inputs, target)."
        )
    for name, function in (("loss_fn", loss_fn), ("compute_loss", compute_loss)):
        if function is not None and not callable(function):
            raise ConfigurationError(f"{name} must be callable, got {type(function).__name__}.")
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

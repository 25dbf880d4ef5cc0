"""Averaging gradients over the ranks of a process group as DDP does, once per optimizer step: small
gradients travel in flat buckets, large ones are all-reduced in place."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from batchfit.errors import ConfigurationError, DoesNotFitError
from batchfit.runtime.devices.oom import first_line, is_out_of_memory
from batchfit.units import format_bytes

#: The most bytes one flat bucket carries (DDP's default bucket_cap_mb). A gradient larger than this
#: is all-reduced on its own, in place.
BUCKET_BYTES = 25 * 2**20


def gradient_mask(parameters: Sequence[torch.nn.Parameter]) -> tuple[bool, ...]:
    """Which parameters hold a gradient on this rank (the ranks agree on what to reduce from these)."""
    return tuple(parameter.grad is not None for parameter in parameters)


class GradientAverage:
    """The gradients of ``parameters`` to average over the ranks, and the buffers that carry them.

    ``masks`` is every rank's ``gradient_mask``: a gradient some rank holds is reduced on all of
    them (as zeros where a rank has none: a parameter its forward did not use), one no rank holds
    stays None. Building it allocates all the memory the reduction needs (those zeros, one bucket
    per dtype), so ``all_reduce`` allocates nothing: the allocation can fail on one rank before any
    rank enters a collective.
    """

    def __init__(
        self,
        parameters: Sequence[torch.nn.Parameter],
        masks: Sequence[Sequence[bool]],
        bucket_bytes: int = BUCKET_BYTES,
    ) -> None:
        self.gradients: list[torch.Tensor] = []
        for index, parameter in enumerate(parameters):
            if not any(mask[index] for mask in masks):
                continue
            if parameter.grad is None:
                parameter.grad = torch.zeros_like(parameter)
            if parameter.grad.is_sparse:
                raise ConfigurationError(
                    f"parameter {index} has a sparse gradient; MicroBatchStep averages dense gradients "
                    f"only (use sparse=False in nn.Embedding)."
                )
            self.gradients.append(parameter.grad)
        self.large = [grad for grad in self.gradients if _nbytes(grad) > bucket_bytes]
        self.small: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
        for grad in self.gradients:
            if _nbytes(grad) <= bucket_bytes:
                self.small.setdefault((grad.device, grad.dtype), []).append(grad)
        self.buffers = {
            (device, dtype): torch.empty(
                min(bucket_bytes // dtype.itemsize, sum(grad.numel() for grad in grads)),
                dtype=dtype,
                device=device,
            )
            for (device, dtype), grads in self.small.items()
        }

    @property
    def buffer_bytes(self) -> int:
        return sum(_nbytes(buffer) for buffer in self.buffers.values())

    def all_reduce(self, group: Any, world_size: int) -> None:
        """Every gradient becomes its mean over the ranks: summed, then divided by ``world_size``."""
        for key, grads in self.small.items():
            buffer = self.buffers[key]
            bucket: list[tuple[torch.Tensor, int]] = []  # (gradient, offset in the buffer)
            used = 0
            for grad in grads:
                if used + grad.numel() > buffer.numel():
                    _reduce_bucket(buffer, bucket, used, group, world_size)
                    bucket, used = [], 0
                buffer[used : used + grad.numel()].view_as(grad).copy_(grad)
                bucket.append((grad, used))
                used += grad.numel()
            _reduce_bucket(buffer, bucket, used, group, world_size)
        for grad in self.large:
            dist.all_reduce(grad, group=group)
            grad.div_(world_size)


def prepare_average(
    parameters: Sequence[torch.nn.Parameter],
    masks: Sequence[Sequence[bool]],
    bucket_bytes: int = BUCKET_BYTES,
) -> GradientAverage:
    """``GradientAverage(...)``; an out-of-memory while it takes its memory is a ``DoesNotFitError``."""
    try:
        return GradientAverage(parameters, masks, bucket_bytes)
    except BaseException as error:
        if not is_out_of_memory(error):
            raise
        raise DoesNotFitError(
            f"out of memory preparing the gradient all-reduce ({first_line(error)}): it needs buckets of "
            f"up to {format_bytes(bucket_bytes)} per dtype beside the gradients, which a smaller "
            f"micro-batch does not lower. The optimizer did not step and the batch's gradients were "
            f"dropped; free memory on this device."
        ) from error


def _reduce_bucket(
    buffer: torch.Tensor, bucket: list[tuple[torch.Tensor, int]], used: int, group: Any, world_size: int
) -> None:
    if not bucket:
        return
    flat = buffer[:used]
    dist.all_reduce(flat, group=group)
    flat.div_(world_size)
    for grad, offset in bucket:
        grad.copy_(buffer[offset : offset + grad.numel()].view_as(grad))


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()

"""The out-of-memory loop of a micro-batched optimizer step, shared by ``MicroBatchStep`` and the
Hugging Face adapter: an attempt runs its micro-batches in lockstep with the other ranks; after an
out-of-memory on any of them, the gradients are dropped, the micro-batch halved (``MicroBatchShrink``
decides), the failed attempt's memory freed, and the attempt runs again. An out-of-memory in the
optimizer step is not retried (``step_optimizer_once``)."""

from __future__ import annotations

import gc
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch
from torch import nn

from batchfit.errors import OptimizerStepOutOfMemoryError
from batchfit.policy.plan.micro_batch import (
    MicroBatchChange,
    MicroBatchOutcome,
    MicroBatchShrink,
    merge_outcomes,
)
from batchfit.runtime.devices.oom import first_line, is_out_of_memory
from batchfit.runtime.distributed.gradients import GradientAverage, prepare_average
from batchfit.runtime.distributed.lockstep import Lockstep

T = TypeVar("T")


@dataclass(frozen=True)
class RanOutOfMemory:
    """An attempt that stopped at a micro-batch that ran out of memory on some rank: where
    ("backward", "forward on rank 1") and the first error's line."""

    where: str
    detail: str


class MicroBatchLoop:
    """Runs attempts at the micro-batch ``shrink`` holds until one fits on every rank; every change
    goes to ``on_change``. Under a process group (``lockstep``) every rank tells the others after
    each micro-batch whether it ran out of memory, so all of them halve together."""

    def __init__(
        self,
        shrink: MicroBatchShrink,
        lockstep: Lockstep | None,
        on_change: Callable[[MicroBatchChange], None],
    ) -> None:
        self.shrink = shrink
        self.lockstep = lockstep
        self.on_change = on_change

    def exchange(self, work: Callable[[], T]) -> list[T]:
        """``work()`` here and, under a process group, every rank's result (see ``Lockstep.run``)."""
        return [work()] if self.lockstep is None else self.lockstep.run(work)

    def micro_batch(self, work: Callable[[], MicroBatchOutcome]) -> list[MicroBatchOutcome] | RanOutOfMemory:
        """``work()`` (one micro-batch, an out-of-memory returned as a value) on every rank: every
        rank's outcome, or where it ran out of memory on any of them."""
        outcomes = self.exchange(work)
        failure = merge_outcomes(outcomes, ranks=self.lockstep is not None)
        return outcomes if failure is None else RanOutOfMemory(*failure)

    def run(
        self,
        attempt: Callable[[], T | RanOutOfMemory],
        *,
        optimizer_step: int,
        samples: int,
        drop: Callable[[], None],
        cuda: bool,
    ) -> T:
        """``attempt()`` until it returns a value; after each ``RanOutOfMemory``, ``drop()`` (the
        attempt's gradients), the halved micro-batch for the batch of ``samples`` at
        ``optimizer_step`` (``DoesNotFitError`` at one sample), and the memory freed (the CUDA cache
        too where ``cuda``)."""
        while True:
            result = attempt()
            if not isinstance(result, RanOutOfMemory):
                return result
            drop()
            self.on_change(self.shrink.out_of_memory(optimizer_step, samples, result.where, result.detail))
            gc.collect()  # the failed attempt's activations, held in cycles with its traceback
            if cuda:
                torch.cuda.empty_cache()

    def average(self, parameters: list[nn.Parameter], masks: list[tuple[bool, ...]]) -> None:
        """The gradients averaged over the ranks, ``masks`` saying which parameters hold one on each
        rank; all the average's memory is taken in its own exchange, before any rank enters its
        collectives."""
        if self.lockstep is None:
            return
        prepared: list[GradientAverage] = []
        self.exchange(lambda: prepared.append(prepare_average(parameters, masks)))
        prepared[0].all_reduce(self.lockstep.group, self.lockstep.world_size)


def step_optimizer_once(step: Callable[[], None], where: str) -> None:
    """``step()``, the optimizer step; an out-of-memory in it raises ``OptimizerStepOutOfMemoryError``
    (``where``: "optimizer step 7, micro_batch_size 16"), as it cannot be run again."""
    try:
        step()
    except BaseException as error:
        if not is_out_of_memory(error):
            raise
        raise OptimizerStepOutOfMemoryError(
            f"out of memory in the optimizer step ({where}): {first_line(error)}. The optimizer may have "
            f"updated part of the parameters and of its state before it failed, so MicroBatchStep does "
            f"not run the step again (that would apply part of it twice), and a smaller micro-batch "
            f"would not lower this memory (the activations are freed by then). Load the last "
            f"checkpoint and lower the optimizer's memory: foreach=False (one parameter at a time, "
            f"fewer temporaries), an optimizer with less state, or a device with more memory."
        ) from error

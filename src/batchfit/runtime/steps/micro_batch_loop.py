"""The out-of-memory loop of a micro-batched optimizer step, shared by ``MicroBatchStep`` and the
Hugging Face adapter: an attempt runs its micro-batches in lockstep with the other ranks; after an
out-of-memory on any of them, the gradients are dropped, the micro-batch halved (``MicroBatchShrink``
decides), the failed attempt's memory freed, and the attempt runs again."""

from __future__ import annotations

import gc
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch

from batchfit.policy.micro_batch import MicroBatchChange, MicroBatchOutcome, MicroBatchShrink, merge_outcomes
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

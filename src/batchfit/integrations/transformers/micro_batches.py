"""An out-of-memory in the Trainer's loop, handled without changing what trains: in training the
loader's batch runs again as micro-batches of half the size, each loss weighted as the user's own
batches weigh it (``LossWeights``), so the optimizer step and the learning-rate schedule stay as
they were; in
evaluation the failure is told to every rank, so all of them shrink the eval batch together."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from batchfit.integrations.transformers.loss_weights import LossWeights, weighted_loss
from batchfit.policy.plan.micro_batch import MicroBatchChange, MicroBatchOutcome, MicroBatchShrink
from batchfit.runtime.devices.oom import first_line, is_out_of_memory
from batchfit.runtime.distributed.gradients import gradient_mask
from batchfit.runtime.distributed.lockstep import Lockstep
from batchfit.runtime.steps.micro_batch_loop import MicroBatchLoop, RanOutOfMemory
from batchfit.runtime.steps.micro_batches import count_samples, micro_batch

#: Where a training micro-batch ran out of memory: the Trainer's step runs forward and backward in one.
PHASE = "the training step"


class RankOutOfMemory(torch.OutOfMemoryError):
    """An evaluation batch ran out of memory on some rank: every rank raises this after the same
    batch, so all of them leave the evaluation and run it again at a smaller batch."""


class TrainingMicroBatches:
    """The micro-batches each of the loop's batches runs as: all of it (``micro_batch_size``), or
    halves of it after an out-of-memory, each weighted (``weights``) so that the optimizer step is
    the one the user's own per-device batch and accumulation give.

    The loop calls ``step`` once per batch, as it calls ``training_step``; the batches of the
    optimizer step so far are kept (the loop holds them anyway), so after an out-of-memory the
    gradients are dropped and every one of them runs again at the halved micro-batch: no sample is
    lost or counted twice. Under a process group every rank tells the others after each
    micro-batch whether it ran out of memory, and all halve together; a ``DistributedDataParallel``
    model runs every micro-batch in ``no_sync()`` and its gradients are averaged once, on the
    optimizer step's last batch, after it succeeded on every rank (as ``MicroBatchStep`` does), so
    no rank waits in DDP's hooks for one that failed.
    """

    def __init__(
        self,
        micro_batch_size: int,
        training_step: Callable[..., torch.Tensor],
        on_change: Callable[[MicroBatchChange], None],
        weights: LossWeights,
    ) -> None:
        self.policy = MicroBatchShrink(micro_batch_size)
        self.training_step = training_step
        self.weights = weights
        #: (batch, num_items_in_batch, its first sample's place in the optimizer step) of this step.
        self.pending: list[tuple[Any, Any, int]] = []
        #: The samples of this optimizer step on this device (``get_batch_samples`` counts them).
        self.group_samples = 0
        self.pending_step = -1  # the optimizer step (global_step) they belong to
        self.lockstep = Lockstep.current()
        self.loop = MicroBatchLoop(self.policy, self.lockstep, on_change)

    @property
    def micro_batch_size(self) -> int:
        return self.policy.micro_batch_size

    def step(self, trainer: Any, model: nn.Module, inputs: Any, num_items_in_batch: Any) -> torch.Tensor:
        """What ``training_step`` returns for ``inputs`` (the loss the loop logs), its gradients
        accumulated; on the optimizer step's last batch, averaged over the ranks."""
        samples = count_samples(inputs, 0)
        if self.pending_step != trainer.state.global_step:  # an optimizer step left unfinished
            self.pending.clear()
        self.pending_step = trainer.state.global_step
        start = sum(count_samples(batch, 0) for batch, _, _ in self.pending)
        self.pending.append((inputs, num_items_in_batch, start))
        if self.group_samples < start + samples:  # called outside the Trainer's loop
            self.group_samples = samples * int(trainer.current_gradient_accumulation_steps)
        loss = self.loop.run(
            functools.partial(self._run, trainer, model, self.policy.micro_batch_size),
            optimizer_step=trainer.state.global_step,
            samples=samples,
            drop=functools.partial(model.zero_grad, set_to_none=True),
            cuda=torch.cuda.is_available(),
        )
        if trainer.accelerator.sync_gradients:  # the optimizer step's last batch
            if isinstance(model, DistributedDataParallel) and self.lockstep is not None:
                parameters = list(model.parameters())
                self.loop.average(parameters, self.lockstep.run(lambda: gradient_mask(parameters)))
            self.pending.clear()
            self.policy.stepped(trainer.state.global_step, samples)
        return loss

    def _run(
        self, trainer: Any, model: nn.Module, first_micro_batch_size: int
    ) -> torch.Tensor | RanOutOfMemory:
        """The new batch as micro-batches, or after an out-of-memory (the micro-batch is no longer
        ``first_micro_batch_size``) every batch of the optimizer step so far, its gradients dropped:
        the loss of the last batch, or where a micro-batch ran out of memory on any rank."""
        retry = self.policy.micro_batch_size != first_micro_batch_size
        todo = list(self.pending) if retry else self.pending[-1:]
        if isinstance(model, DistributedDataParallel) and todo[0] is self.pending[0]:
            model.require_forward_param_sync = True  # buffers broadcast at the step's first forward
        losses: list[torch.Tensor] = []
        for batch, num_items_in_batch, start in todo:
            losses = []
            failure = self._batch(trainer, model, batch, num_items_in_batch, start, losses)
            if failure is not None:
                return failure
        return torch.stack(losses).sum()

    def _batch(
        self,
        trainer: Any,
        model: nn.Module,
        batch: Any,
        num_items_in_batch: Any,
        first: int,
        losses: list[torch.Tensor],
    ) -> RanOutOfMemory | None:
        samples, start = count_samples(batch, 0), 0
        micro = self.policy.micro_batch_size
        context = (
            f"micro_batch_size {micro}, halved after an out-of-memory in training"
            if micro < samples
            else f"the loader's batch of {samples}"
        )
        for size in self.policy.sizes(samples):
            for piece in self.weights.cut(first + start, size, self.group_samples):
                part = batch if piece == samples else micro_batch(batch, start, piece, 0)
                scale = self.weights.scale(first + start, piece, self.group_samples, context)
                work = functools.partial(
                    self._micro_batch, trainer, model, part, num_items_in_batch, scale, losses
                )
                outcomes = self.loop.micro_batch(work)
                if isinstance(outcomes, RanOutOfMemory):
                    return outcomes
                start += piece
        return None

    def _micro_batch(
        self,
        trainer: Any,
        model: nn.Module,
        part: Any,
        num_items_in_batch: Any,
        scale: tuple[int, float],
        losses: list[torch.Tensor],
    ) -> MicroBatchOutcome:
        """The Trainer's step on ``part``, with ``scale``: the accumulation steps the Trainer divides
        by where its rule divides (the user's batches in the optimizer step), and the weight of its
        loss; this rank's outcome, an out-of-memory as a value."""
        accumulation = trainer.current_gradient_accumulation_steps
        trainer.current_gradient_accumulation_steps, weight = scale
        try:
            with (
                model.no_sync() if isinstance(model, DistributedDataParallel) else contextlib.nullcontext(),
                weighted_loss(trainer, weight),
            ):
                losses.append(self.training_step(model, part, num_items_in_batch))
        except BaseException as error:
            if not is_out_of_memory(error):
                raise
            return MicroBatchOutcome(
                count_samples(part, 0), (PHASE, first_line(error))
            )  # the others must hear it
        finally:
            trainer.current_gradient_accumulation_steps = accumulation
        return MicroBatchOutcome(count_samples(part, 0))


def predict_in_lockstep(predict: Callable[[], Any], lockstep: Lockstep | None) -> Any:
    """``predict()`` (one evaluation batch); under a process group every rank hears whether it ran
    out of memory on any rank, and all raise ``RankOutOfMemory`` after the same batch."""
    if lockstep is None:
        return predict()
    error: BaseException | None = None
    try:
        outputs = predict()
    except BaseException as raised:
        error, outputs = raised, None

    def tell() -> str | None:
        if error is not None and not is_out_of_memory(error):
            raise error  # every rank stops: this one with it, the others with RankFailedError
        return None if error is None else first_line(error)

    failures = [(rank, told) for rank, told in enumerate(lockstep.run(tell)) if told is not None]
    if failures:
        rank, told = failures[0]
        raise RankOutOfMemory(f"evaluation ran out of memory on rank {rank} of {lockstep.world_size}: {told}")
    return outputs

"""``MicroBatchStep``: one optimizer step on a full per-device batch, run as micro-batches with gradient
accumulation, that halves the micro-batch and runs the same batch again after an out-of-memory."""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from batchfit.errors import ArgumentTypeError
from batchfit.policy.noise.noise_scale import NoiseScale
from batchfit.policy.plan.micro_batch import MicroBatchChange, MicroBatchOutcome, MicroBatchShrink
from batchfit.runtime.devices.oom import first_line, is_out_of_memory
from batchfit.runtime.distributed.gradients import gradient_mask
from batchfit.runtime.distributed.lockstep import Lockstep
from batchfit.runtime.steps.micro_batch_checks import check_arguments
from batchfit.runtime.steps.micro_batch_finite import non_finite_error, ranks_not_finite, scaler_in_charge
from batchfit.runtime.steps.micro_batch_loop import MicroBatchLoop, RanOutOfMemory, step_optimizer_once
from batchfit.runtime.steps.micro_batch_options import MicroBatchOptions
from batchfit.runtime.steps.micro_batch_reduction import resolve_reduction
from batchfit.runtime.steps.micro_batches import count_samples, micro_batch
from batchfit.runtime.steps.noise_monitoring import StepNoise
from batchfit.runtime.workloads.default_step import model_loss, scalar_loss
from batchfit.training_loop.schedule import step_optimizer

if TYPE_CHECKING:
    from torch.amp import GradScaler
    from torch.optim.lr_scheduler import LRScheduler

logger = logging.getLogger(__name__)
__all__ = ["MicroBatchOptions", "MicroBatchStep"]
#: A micro-batch's loss times its weight, detached, by its index in the step's split.
Losses = list[tuple[int, torch.Tensor]]
#: A step's accumulated gradients: the weighted losses, the micro-batches' sizes, each rank's mask.
Accumulated = tuple[Losses, list[int], list[tuple[bool, ...] | None]]


class MicroBatchStep:
    """One optimizer step per call on a full per-device batch, run as micro-batches with gradient
    accumulation; after an out-of-memory it halves the micro-batch and runs the same batch again.

        step = MicroBatchStep(model, optimizer, F.cross_entropy, micro_batch_size=64)
        for inputs, targets in loader:          # full per-device batches
            loss = step((inputs, targets))      # one optimizer step; the batch's mean loss

    The batch is a pytree: its tensors are cut along ``options.batch_dim`` (they must agree on its
    size), its other leaves go to every micro-batch. The loss is ``loss_fn(model(inputs), target)``
    on a batch ``(inputs, target)``, else the model's output (or its ``.loss``/``["loss"]``), as in
    ``Workload``. ``compute_loss(model, micro_batch) -> loss`` replaces that; unlike Workload's
    ``train_step`` it returns the loss instead of stepping, because the micro-batches' gradients
    must add up before the one optimizer step. ``options`` (``MicroBatchOptions``) holds the rest:
    clipping, growing back, the loss's reduction, non-finite handling, the noise-scale monitor.

    Each micro-batch's loss is backpropagated times a weight that makes the accumulated gradient the
    full batch's, as ``options.reduction`` says ("mean", "sum", "token_mean"; see
    ``MicroBatchOptions``). The call returns the full batch's loss, detached. A loss or gradient that
    is not finite raises ``NonFiniteError``, the gradients dropped and nothing stepped (or, with
    ``non_finite="skip"``, skips the step as a ``GradScaler`` does, counted in ``skipped_steps``).

    An out-of-memory in a forward or backward drops the batch's gradients, frees memory, halves the
    micro-batch that failed and runs the batch again from its first micro-batch: no sample is lost or
    counted twice, and the optimizer, ``scaler`` and ``scheduler`` see only the attempt that
    succeeds. At one sample it raises ``DoesNotFitError``; any other error propagates, the gradients
    dropped. With ``grow_after``, the micro-batch doubles after that many clean optimizer steps, up
    to ``micro_batch_size``. Each change is logged (WARNING; rank 0) and kept in ``history``. An
    out-of-memory in the optimizer step raises ``OptimizerStepOutOfMemoryError`` and is not retried:
    the optimizer may have updated part of the parameters and its state before it failed.

    Under a process group of 2+ ranks every rank tells the others, after each micro-batch, whether
    it ran out of memory (one ``Lockstep`` collective), and all halve together; an error that is not
    an out-of-memory raises on its rank and ``RankFailedError`` on the others. Every rank's batch
    must hold as many samples. A ``DistributedDataParallel`` model runs every micro-batch in
    ``no_sync()``; its gradients are averaged once, after the last micro-batch succeeded on every
    rank. Collectives inside the forward (SyncBatchNorm) and FSDP are not covered.

    With ``options.noise_monitor`` (a ``NoiseScaleMonitor``) each optimizer step of two or more
    micro-batches of one size is read (one extra copy of the gradients; under a process group
    averaged over the ranks). Every ``every`` steps the noise scale is logged (INFO) and kept in
    ``noise_scale``, a ``NoiseScale`` that ``Goal`` and ``Checklist`` take as it is. With the
    monitor's ``BatchSchedule``, a change multiplies the learning rates by the rule's factor, is
    logged (WARNING) and sets ``batch_size``, the per-device batch to feed from then on.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        loss_fn: Callable[[Any, Any], torch.Tensor] | None = None,
        *,
        micro_batch_size: int,
        compute_loss: Callable[[nn.Module, Any], torch.Tensor] | None = None,
        scaler: GradScaler | None = None,
        scheduler: LRScheduler | None = None,
        options: MicroBatchOptions | None = None,
    ) -> None:
        options = MicroBatchOptions() if options is None else options
        check_arguments(
            model, optimizer, loss_fn=loss_fn, compute_loss=compute_loss, scaler=scaler, scheduler=scheduler
        )
        if not isinstance(options, MicroBatchOptions):
            raise ArgumentTypeError(
                f"options must be a batchfit.MicroBatchOptions or None, got {type(options).__name__}."
            )
        self.options = options
        self.reduction = resolve_reduction(options.reduction, options.ignore_index, loss_fn)
        self.skipped_steps = 0  # steps skipped for a loss or gradient that was not finite
        self._policy = MicroBatchShrink(micro_batch_size, grow_after=options.grow_after)
        self.model, self.optimizer, self.loss_fn, self.compute_loss = model, optimizer, loss_fn, compute_loss
        self.scaler, self.scheduler = scaler, scheduler
        self.batch_dim = options.batch_dim
        self.optimizer_steps = 0  # completed
        self._parameters = list(model.parameters())
        self._ddp = isinstance(model, DistributedDataParallel)
        lockstep = Lockstep(model.process_group) if self._ddp else Lockstep.current()
        self._lockstep = lockstep if lockstep is not None and lockstep.world_size > 1 else None
        self._loop = MicroBatchLoop(self._policy, self._lockstep, self._log)
        monitor = self.noise_monitor = options.noise_monitor
        self._noise = (
            None if monitor is None else StepNoise(monitor, self._parameters, scaler, self._lockstep)
        )
        self.batch_size: int | None = None  # per device: the last call's, or the schedule's after a change

    @property
    def noise_scale(self) -> NoiseScale | None:
        """The gradient noise scale the monitor measured last (None: no monitor, or not yet)."""
        return None if self.noise_monitor is None else self.noise_monitor.noise_scale

    @property
    def micro_batch_size(self) -> int:
        """The micro-batch the next call starts with."""
        return self._policy.micro_batch_size

    @property
    def history(self) -> tuple[MicroBatchChange, ...]:
        """Every change of the micro-batch so far, oldest first."""
        return self._policy.history

    def __call__(self, batch: Any) -> torch.Tensor:
        """One optimizer step on ``batch``; the full batch's loss (detached)."""
        samples = count_samples(batch, self.batch_dim)
        self._drop_gradients()
        try:
            losses, sizes, masks = self._accumulate(batch, samples)
            loss = torch.stack([weighted for _, weighted in losses]).sum()
            reading = None if self._noise is None else self._noise.end_step()
            if self._ddp:
                self._loop.average(self._parameters, [mask for mask in masks if mask is not None])
            cause = None
            if not scaler_in_charge(self.scaler):
                cause = ranks_not_finite(self._loop.exchange, losses, sizes, self.model, self._parameters)
            if cause is not None and self.options.non_finite == "raise":
                raise non_finite_error(self.optimizer_steps, self.micro_batch_size, cause)
            if cause is not None:
                self._skip(cause)
                return loss
            self._loop.exchange(self._step_optimizer)
        except BaseException:
            self._drop_gradients()
            raise
        if self.scheduler is not None:
            self.scheduler.step()
        self._drop_gradients()
        self.batch_size = samples
        if reading is not None and self._noise is not None:
            schedulers = [] if self.scheduler is None else [self.scheduler]
            self.batch_size = self._noise.after_step(
                reading, self.optimizer_steps, self.optimizer, schedulers, logger, samples
            )
        change = self._policy.stepped(self.optimizer_steps, samples)
        self.optimizer_steps += 1
        if change is not None:
            self._log(change)
        return loss

    def _accumulate(self, batch: Any, samples: int) -> Accumulated:
        """The gradients of the whole batch, accumulated micro-batch by micro-batch, at half the
        micro-batch again after an out-of-memory on any rank."""
        weigh = self.reduction.weights(batch, samples, self.batch_dim)
        return self._loop.run(
            functools.partial(self._attempt, batch, samples, weigh),
            optimizer_step=self.optimizer_steps,
            samples=samples,
            drop=self._drop_attempt,
            cuda=any(parameter.is_cuda for parameter in self._parameters),
        )

    def _attempt(
        self, batch: Any, samples: int, weigh: Callable[[list[int]], list[float]]
    ) -> Accumulated | RanOutOfMemory:
        """One run of the batch's micro-batches at the current micro-batch; the weighted losses, the
        micro-batches' sizes and each rank's gradient mask, or where one ran out of memory."""
        sizes = self._loop.shrink.sizes(samples)
        weights = weigh(sizes)
        if self._noise is not None:
            self._noise.begin(sizes, even=len(set(weights)) == 1)
        losses: Losses = []
        if isinstance(self.model, DistributedDataParallel):
            self.model.require_forward_param_sync = True  # buffers broadcast at the first forward
        start, masks = 0, list[tuple[bool, ...] | None]()
        for index, size in enumerate(sizes):
            part, last = (index, start, size, weights[index]), index == len(sizes) - 1
            outcomes = self._loop.micro_batch(functools.partial(self._micro_batch, batch, part, last, losses))
            if isinstance(outcomes, RanOutOfMemory):
                return outcomes
            start, masks = start + size, [outcome.gradients for outcome in outcomes]
        return losses, sizes, masks

    def _drop_attempt(self) -> None:
        self._drop_gradients()
        if self._noise is not None:
            self._noise.drop()

    def _micro_batch(
        self, batch: Any, part: tuple[int, int, int, float], last: bool, losses: Losses
    ) -> MicroBatchOutcome:
        """Forward and backward of micro-batch ``part`` (its index, first sample, size and weight);
        this rank's outcome. A micro-batch of weight 0 (no target token to count) adds nothing:
        it runs no backward, and a forward only under DDP, whose first forward of a step broadcasts
        the buffers, a collective every rank must run at the same micro-batch."""
        samples = count_samples(batch, self.batch_dim)
        index, start, size, weight = part
        phase = "forward"
        try:
            with self._no_sync():
                if weight == 0:
                    if self._ddp:
                        with torch.no_grad():
                            self._loss(micro_batch(batch, start, size, self.batch_dim))
                    return MicroBatchOutcome(samples, None, self._mask(last))
                weighted = self._loss(micro_batch(batch, start, size, self.batch_dim)) * weight
                phase = "backward"
                (self.scaler.scale(weighted) if self.scaler is not None else weighted).backward()
                if self._noise is not None:
                    self._noise.after_backward()
        except BaseException as error:
            if not is_out_of_memory(error):
                raise
            return MicroBatchOutcome(samples, (phase, first_line(error)))  # the other ranks must hear it
        losses.append((index, weighted.detach()))
        return MicroBatchOutcome(samples, None, self._mask(last))

    def _mask(self, last: bool) -> tuple[bool, ...] | None:
        """After the last micro-batch of a DDP model, which parameters hold a gradient."""
        return gradient_mask(self._parameters) if last and self._ddp else None

    def _loss(self, micro_batch: Any) -> torch.Tensor:
        hint = (
            f"it must return one loss for the micro-batch, reduced as reduction says "
            f"({self.reduction.reduction!r}, {self.reduction.source}): MicroBatchStep weights it so "
            f"that the micro-batches add up to the full batch's loss."
        )
        if self.compute_loss is None:
            return model_loss(
                self.model,
                micro_batch,
                self.loss_fn,
                owner="MicroBatchStep",
                custom="compute_loss",
                hint=hint,
            )
        return scalar_loss(self.compute_loss(self.model, micro_batch), "compute_loss", hint)

    def _skip(self, cause: str) -> None:
        """The step not taken, as a GradScaler skips one: gradients dropped, nothing stepped."""
        self._drop_gradients()
        self.skipped_steps += 1
        if self._lockstep is None or self._lockstep.rank == 0:
            logger.warning(
                f"MicroBatchStep: skipped optimizer step {self.optimizer_steps}: {cause}; the gradients "
                f"were dropped, and the optimizer and scheduler did not step ({self.skipped_steps} "
                f"skipped so far)."
            )

    def _step_optimizer(self) -> None:
        where = f"optimizer step {self.optimizer_steps}, micro_batch_size {self.micro_batch_size}"
        arguments = (self.optimizer, self._parameters, self.scaler, self.options.max_grad_norm)
        step_optimizer_once(functools.partial(step_optimizer, *arguments), where)

    def _no_sync(self) -> contextlib.AbstractContextManager[Any]:
        if isinstance(self.model, DistributedDataParallel):
            return self.model.no_sync()  # every micro-batch: the gradients are averaged after the last
        return contextlib.nullcontext()

    def _drop_gradients(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        for parameter in self._parameters:
            parameter.grad = None

    def _log(self, change: MicroBatchChange) -> None:
        if self._lockstep is None or self._lockstep.rank == 0:
            logger.warning(
                f"MicroBatchStep: micro_batch_size {change.old_micro_batch_size} -> "
                f"{change.new_micro_batch_size} at optimizer step {change.optimizer_step}: {change.reason}."
            )

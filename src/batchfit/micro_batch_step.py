"""``MicroBatchStep``: one optimizer step on a full per-device batch, run as micro-batches with gradient
accumulation, that halves the micro-batch and runs the same batch again after an out-of-memory."""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from batchfit.errors import NonFiniteError, OptimizerStepOutOfMemoryError
from batchfit.policy.micro_batch import MicroBatchChange, MicroBatchOutcome, MicroBatchShrink
from batchfit.policy.noise_monitor import NoiseScaleMonitor
from batchfit.runtime.devices.oom import first_line, is_out_of_memory
from batchfit.runtime.distributed.gradients import GradientAverage, gradient_mask, prepare_average
from batchfit.runtime.distributed.lockstep import Lockstep
from batchfit.runtime.steps.finite import WHAT_TO_CHECK
from batchfit.runtime.steps.micro_batch_checks import check_arguments
from batchfit.runtime.steps.micro_batch_finite import (
    NonFinite,
    all_finite,
    scaler_in_charge,
    what_is_not_finite,
)
from batchfit.runtime.steps.micro_batch_loop import MicroBatchLoop, RanOutOfMemory
from batchfit.runtime.steps.micro_batch_reduction import Reduction, resolve_reduction
from batchfit.runtime.steps.micro_batches import count_samples, micro_batch
from batchfit.runtime.steps.noise_monitoring import StepNoise, report_line
from batchfit.runtime.workloads.default_step import model_loss, scalar_loss
from batchfit.schedule import step_optimizer

if TYPE_CHECKING:
    from torch.amp import GradScaler
    from torch.optim.lr_scheduler import LRScheduler

logger = logging.getLogger(__name__)
T = TypeVar("T")
#: A micro-batch's loss times its weight, detached, by its index in the step's split.
Losses = list[tuple[int, torch.Tensor]]
#: A step's accumulated gradients: the weighted losses, the micro-batches' sizes, each rank's mask.
Accumulated = tuple[Losses, list[int], list[tuple[bool, ...] | None]]


class MicroBatchStep:
    """One optimizer step per call on a full per-device batch, run as micro-batches with gradient
    accumulation; after an out-of-memory it halves the micro-batch and runs the same batch again.

        step = MicroBatchStep(model, optimizer, loss_fn=F.cross_entropy, micro_batch_size=64)
        for inputs, targets in loader:          # full per-device batches
            loss = step((inputs, targets))      # one optimizer step; the batch's mean loss

    The batch is a pytree: its tensors are cut along ``batch_dim`` (they must agree on its size),
    its other leaves go to every micro-batch. The loss is ``loss_fn(model(inputs), target)`` on a
    batch ``(inputs, target)``, else the model's output (or its ``.loss``/``["loss"]``), as in
    ``Workload``. ``compute_loss(model, micro_batch) -> loss`` replaces that; unlike Workload's
    ``train_step(model, optimizer, batch)`` it returns the loss instead of stepping, because the
    micro-batches' gradients must add up before the one optimizer step.

    Each micro-batch's loss is backpropagated times a weight that makes the accumulated gradient the
    full batch's, as ``reduction`` says what one micro-batch's loss is: ``"mean"`` over its n_i of
    the batch's N samples (weight n_i / N), ``"sum"`` over them (weight 1), ``"token_mean"`` over the
    t_i elements of its target that are not ``ignore_index`` (weight t_i / T, T the batch's: a
    cross-entropy over padded sequences; the target is a pair's second element or a mapping's
    ``"labels"``, and a micro-batch with none runs no backward). None reads it from ``loss_fn`` when
    that is a torch loss module (``nn.CrossEntropyLoss(reduction="sum")``, its ``ignore_index``),
    else takes the mean. The call returns the full batch's loss, detached.

    A loss or accumulated gradient that is not finite (NaN, inf) raises ``NonFiniteError`` naming the
    optimizer step and the micro-batch, the gradients dropped and nothing stepped; with
    ``non_finite="skip"`` the step is skipped instead, as a ``GradScaler`` skips one (gradients
    dropped, optimizer and scheduler not stepped, logged at WARNING and counted in
    ``skipped_steps``). With an enabled ``scaler``, its own inf handling is in charge.

    An out-of-memory in a forward or backward (``is_out_of_memory``) drops the batch's gradients,
    frees memory, halves the micro-batch that failed and runs the batch again from its first
    micro-batch: no sample is lost or counted twice, and the optimizer, ``scaler`` and ``scheduler``
    see only the attempt that succeeds. At one sample it raises ``DoesNotFitError``. Any other error
    propagates unchanged, the gradients dropped. With ``grow_after``, the micro-batch doubles after
    that many optimizer steps in a row without an out-of-memory, up to ``micro_batch_size``. Each
    change is logged (WARNING; rank 0 under a process group) and kept in ``history``.

    An out-of-memory in the optimizer step (unscaling, clipping, ``optimizer.step``,
    ``scaler.update``) raises ``OptimizerStepOutOfMemoryError`` and is not retried: the optimizer may
    have updated part of the parameters and of its state before it failed (foreach kernels update
    in groups, the for-loop one parameter at a time), so a second run would apply part of the
    update twice, and a smaller micro-batch would not lower that phase's memory (the activations
    are freed by then). Load the last checkpoint and lower the optimizer's own memory.

    Under a process group of 2+ ranks every rank tells the others, after each micro-batch, whether
    it ran out of memory (one ``Lockstep`` collective): if any did, all drop their gradients and
    halve together, so they always hold the same micro-batch; an error that is not an out-of-memory
    raises on its rank and ``RankFailedError`` on the others. Every rank's batch must hold the same
    number of samples. A ``DistributedDataParallel`` model runs every micro-batch in ``no_sync()``;
    its gradients are averaged over the ranks once, after the last micro-batch succeeded on every
    rank (flat buckets, summed then divided by the world size; DDP comm hooks are not used), so a
    rank that fails in backward never leaves another waiting in DDP's hooks. Collectives inside the
    forward (SyncBatchNorm) and FSDP are not covered. BatchNorm sees micro-batches, as with any
    accumulation, and the forwards of a failed attempt have already updated its running statistics.

    With ``noise_scale`` (a ``NoiseScaleMonitor``) each optimizer step of two or more micro-batches
    of one size is read: each micro-batch's gradient against the step's accumulated one (one extra
    copy of the gradients; under a process group each rank's, averaged over the ranks). Every
    ``every`` steps the noise scale ``B_simple`` is logged (INFO) and kept in
    ``noise_scale.latest``. With the monitor's ``BatchSchedule``, a change multiplies the
    optimizer's learning rates (and the scheduler's ``base_lrs``) by the rule's factor, is logged
    (WARNING) with its evidence, and sets ``batch_size`` to the per-device batch to feed from then
    on: the micro-batch stays, so the accumulation grows and the memory does not.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        loss_fn: Callable[[Any, Any], torch.Tensor] | None = None,
        micro_batch_size: int,
        compute_loss: Callable[[nn.Module, Any], torch.Tensor] | None = None,
        scaler: GradScaler | None = None,
        scheduler: LRScheduler | None = None,
        max_grad_norm: float | None = None,
        grow_after: int | None = None,
        batch_dim: int = 0,
        noise_scale: NoiseScaleMonitor | None = None,
        reduction: Reduction | None = None,
        ignore_index: int | None = None,
        non_finite: NonFinite = "raise",
    ) -> None:
        check_arguments(
            model,
            optimizer,
            loss_fn=loss_fn,
            compute_loss=compute_loss,
            scaler=scaler,
            scheduler=scheduler,
            max_grad_norm=max_grad_norm,
            batch_dim=batch_dim,
            noise_scale=noise_scale,
            non_finite=non_finite,
        )
        self.reduction = resolve_reduction(reduction, ignore_index, loss_fn)
        self.non_finite = non_finite
        self.skipped_steps = 0  # steps skipped for a loss or gradient that was not finite
        self._policy = MicroBatchShrink(micro_batch_size, grow_after=grow_after)
        self.model = model
        self.optimizer = optimizer
        self.loss_fn = loss_fn
        self.compute_loss = compute_loss
        self.scaler = scaler
        self.scheduler = scheduler
        self.max_grad_norm = max_grad_norm
        self.batch_dim = batch_dim
        self.optimizer_steps = 0  # completed
        self._parameters = list(model.parameters())
        self._ddp = isinstance(model, DistributedDataParallel)
        lockstep = Lockstep(model.process_group) if self._ddp else Lockstep.current()
        self._lockstep = lockstep if lockstep is not None and lockstep.world_size > 1 else None
        self._loop = MicroBatchLoop(self._policy, self._lockstep, self._log)
        self.noise_scale = noise_scale
        self._noise = (
            None
            if noise_scale is None
            else StepNoise(noise_scale, model.parameters(), scaler, self._lockstep)
        )
        self.batch_size: int | None = None  # per device: the last call's, or the schedule's after a change

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
            if self._ddp and self._lockstep is not None:
                self._average_gradients(self._lockstep, masks)
            cause = None if scaler_in_charge(self.scaler) else self._non_finite(losses, sizes)
            if cause is not None and self.non_finite == "raise":
                raise NonFiniteError(
                    f"MicroBatchStep, optimizer step {self.optimizer_steps} (micro_batch_size "
                    f"{self.micro_batch_size}): {cause}; the optimizer did not step and the batch's "
                    f"gradients were dropped. Pass non_finite='skip' to skip such a step as a GradScaler "
                    f"does. {WHAT_TO_CHECK}"
                )
            if cause is not None:
                self._skip(cause)
                return loss
            self._exchange(self._step_optimizer)
        except BaseException:
            self._drop_gradients()
            raise
        if self.scheduler is not None:
            self.scheduler.step()
        self._drop_gradients()
        self.batch_size = samples
        if reading is not None and self._noise is not None:
            report = self._noise.record(reading, self.optimizer_steps, self.optimizer, self._schedulers())
            if report is not None:
                self.batch_size = self._noise.batch_size_after(report, samples)
                if self._lockstep is None or self._lockstep.rank == 0:
                    level = logging.INFO if report.change is None else logging.WARNING
                    logger.log(level, report_line(report, self.batch_size))
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
        start = 0
        for index, size in enumerate(sizes):
            last = index == len(sizes) - 1
            part = (index, start, size, weights[index])
            outcomes = self._loop.micro_batch(functools.partial(self._micro_batch, batch, part, last, losses))
            if isinstance(outcomes, RanOutOfMemory):
                return outcomes
            start += size
        return losses, sizes, [outcome.gradients for outcome in outcomes]

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

    def _non_finite(self, losses: Losses, sizes: list[int]) -> str | None:
        """What is not finite among the losses and gradients, on every rank that holds one (the
        ranks decide together); None where all are finite."""

        def here() -> str:
            if all_finite([loss for _, loss in losses], self._parameters):
                return ""
            return what_is_not_finite(losses, sizes, list(self.model.named_parameters()))

        found = self._exchange(here)
        if not any(found):
            return None
        if self._lockstep is None:
            return found[0]
        return "; ".join(f"on rank {rank}, {cause}" for rank, cause in enumerate(found) if cause)

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

    def _average_gradients(self, lockstep: Lockstep, masks: list[tuple[bool, ...] | None]) -> None:
        prepared: list[GradientAverage] = []
        held = [mask for mask in masks if mask is not None]
        # All the average's memory is taken in its own exchange, before any rank enters its collectives.
        self._exchange(functools.partial(self._prepare_average, held, prepared))
        prepared[0].all_reduce(lockstep.group, lockstep.world_size)

    def _prepare_average(self, masks: list[tuple[bool, ...]], prepared: list[GradientAverage]) -> None:
        prepared.append(prepare_average(self._parameters, masks))

    def _step_optimizer(self) -> None:
        try:
            step_optimizer(self.optimizer, self._parameters, self.scaler, self.max_grad_norm)
        except BaseException as error:
            if not is_out_of_memory(error):
                raise
            raise OptimizerStepOutOfMemoryError(
                f"out of memory in the optimizer step (optimizer step {self.optimizer_steps}, "
                f"micro_batch_size {self.micro_batch_size}): {first_line(error)}. The optimizer may have "
                f"updated part of the parameters and of its state before it failed, so MicroBatchStep does "
                f"not run the step again (that would apply part of it twice), and a smaller micro-batch "
                f"would not lower this memory (the activations are freed by then). Load the last "
                f"checkpoint and lower the optimizer's memory: foreach=False (one parameter at a time, "
                f"fewer temporaries), an optimizer with less state, or a device with more memory."
            ) from error

    def _exchange(self, work: Callable[[], T]) -> list[T]:
        return self._loop.exchange(work)

    def _no_sync(self) -> contextlib.AbstractContextManager[Any]:
        if isinstance(self.model, DistributedDataParallel):
            return self.model.no_sync()  # every micro-batch: the gradients are averaged after the last
        return contextlib.nullcontext()

    def _drop_gradients(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        for parameter in self._parameters:
            parameter.grad = None

    def _schedulers(self) -> list[LRScheduler]:
        return [] if self.scheduler is None else [self.scheduler]

    def _log(self, change: MicroBatchChange) -> None:
        if self._lockstep is None or self._lockstep.rank == 0:
            logger.warning(
                f"MicroBatchStep: micro_batch_size {change.old_micro_batch_size} -> "
                f"{change.new_micro_batch_size} at optimizer step {change.optimizer_step}: {change.reason}."
            )

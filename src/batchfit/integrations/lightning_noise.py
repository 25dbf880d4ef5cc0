"""PyTorch Lightning: ``NoiseScaleCallback`` logs the gradient noise scale every N optimizer steps
from the Trainer's own accumulated micro-batches, and with a ``BatchSchedule`` grows
``accumulate_grad_batches`` (the loaders' batch, and so memory, unchanged) and the learning rate."""

from __future__ import annotations

import logging
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback

from batchfit.errors import ConfigurationError
from batchfit.policy.noise.noise_scale import NoiseScale
from batchfit.policy.plan.batch_schedule import ScheduleChange
from batchfit.policy.plan.noise_monitor import NoiseScaleMonitor
from batchfit.runtime.steps.gradient_noise import AccumulationNoise
from batchfit.runtime.steps.learning_rate import scale_learning_rate
from batchfit.runtime.steps.micro_batches import count_samples

logger = logging.getLogger(__name__)


class NoiseScaleCallback(Callback):
    """Reads each optimizer step's micro-batches (``accumulate_grad_batches`` of them, which must be
    2 or more: one micro-batch has no smaller batch to compare with) against their accumulated
    gradient, one extra copy of the gradients, and feeds ``monitor`` (a ``NoiseScaleMonitor``).
    Every ``monitor.every`` steps it logs ``noise_scale/b_simple`` (and its interval's
    ``noise_scale/low``, ``noise_scale/high``) through the module's logger, and the line to this
    module's logger (rank 0).

    With the monitor's ``BatchSchedule``, a change sets ``trainer.accumulate_grad_batches`` at the
    start of the next accumulation that both sizes divide (so no step mixes the two) and multiplies
    the learning rate of the first optimizer (and its schedulers' ``base_lrs``) by the rule's
    factor; it is logged (WARNING) with its evidence and kept in ``monitor.changes``.

    One device: under DDP the gradients are all-reduced in the last micro-batch's backward, so a
    micro-batch's own gradient cannot be read there (measure offline with
    ``batchfit.noise_scale``). A step with a micro-batch of another size (an epoch's short last
    batch) or fewer micro-batches gives no reading. 16-bit mixed precision's GradScaler is refused:
    Lightning unscales before the optimizer step, between the micro-batches' reads and the step's.
    """

    def __init__(self, monitor: NoiseScaleMonitor) -> None:
        if not isinstance(monitor, NoiseScaleMonitor):
            raise ConfigurationError(
                "monitor must be a batchfit.policy.plan.noise_monitor.NoiseScaleMonitor, got "
                f"{type(monitor).__name__}."
            )
        self.monitor = monitor
        self._collector: AccumulationNoise | None = None
        self._sizes: list[int] = []  # this step's micro-batches
        self._pending: ScheduleChange | None = None

    @property
    def noise_scale(self) -> NoiseScale | None:
        """The monitor's latest noise scale (None before its first report): what ``Goal`` takes."""
        return self.monitor.noise_scale

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        _check(trainer, pl_module)

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        pending = self._pending
        old = trainer.accumulate_grad_batches
        if pending is not None and batch_idx % old == 0 and batch_idx % pending.new_accumulation_steps == 0:
            trainer.accumulate_grad_batches = pending.new_accumulation_steps
            schedulers = [config.scheduler for config in trainer.lr_scheduler_configs]
            scale_learning_rate(trainer.optimizers[0], pending.learning_rate_factor, schedulers)
            self._pending = None
        self._sizes.append(count_samples(batch, 0))

    def on_after_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._collector is None or self._collector.micro_batch_size != self._sizes[0]:
            self._collector = AccumulationNoise(pl_module.parameters(), self._sizes[0])
        self._collector.after_backward()

    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        sizes, self._sizes = self._sizes, []
        collector = self._collector
        if collector is None:
            return
        if len(sizes) != trainer.accumulate_grad_batches or len(set(sizes)) > 1 or len(sizes) < 2:
            self._collector = None  # an uneven step: no reading, and the copy starts afresh
            return
        reading = collector.end_step()
        if reading is None:
            return
        report = self.monitor.record(
            reading,
            optimizer_step=trainer.global_step,
            accumulation_steps=len(sizes),
            micro_batch_size=sizes[0],
            optimizer=type(optimizer).__name__,
        )
        if report is None:
            return
        noise = report.noise_scale
        if noise.resolved:
            pl_module.log("noise_scale/b_simple", noise.b_simple, on_step=True, on_epoch=False)
        if noise.low is not None and noise.high is not None:
            pl_module.log("noise_scale/low", noise.low, on_step=True, on_epoch=False)
            pl_module.log("noise_scale/high", noise.high, on_step=True, on_epoch=False)
        if report.change is not None:
            self._pending = report.change
        if trainer.is_global_zero:
            logger.log(logging.INFO if report.change is None else logging.WARNING, "%s", report.line())


def _check(trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
    if trainer.world_size > 1:
        raise ConfigurationError(
            f"NoiseScaleCallback reads one device's micro-batches, and the Trainer runs {trainer.world_size} "
            f"ranks: DDP all-reduces in the last micro-batch's backward, where a micro-batch's own gradient "
            f"cannot be read. Measure the noise scale on one device, or offline with batchfit.noise_scale."
        )
    if trainer.accumulate_grad_batches < 2:
        raise ConfigurationError(
            f"NoiseScaleCallback needs accumulate_grad_batches >= 2, got "
            f"{trainer.accumulate_grad_batches}: the noise scale compares a micro-batch's gradient with "
            f"the accumulated batch's, and one micro-batch has nothing to compare with. Halve the "
            f"loader's batch_size and set "
            f"accumulate_grad_batches=2 (the same global batch)."
        )
    if not pl_module.automatic_optimization:
        raise ConfigurationError(
            f"{type(pl_module).__name__} sets automatic_optimization=False; NoiseScaleCallback reads the "
            f"Trainer's own accumulation. Read your steps with batchfit's AccumulationNoise instead."
        )
    if getattr(trainer.precision_plugin, "scaler", None) is not None:
        raise ConfigurationError(
            "NoiseScaleCallback does not read 16-mixed precision's GradScaler steps (Lightning unscales "
            "the gradients between the micro-batches' reads and the step's); use bf16-mixed or 32-true."
        )

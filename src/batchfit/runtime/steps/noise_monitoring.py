"""``MicroBatchStep``'s noise-scale monitor: each optimizer step's micro-batches read against their
accumulated batch (``AccumulationNoise``), the ranks' readings averaged, the monitor fed, and the
schedule's changes applied to the optimizer's learning rate."""

from __future__ import annotations

import logging
import statistics
from collections.abc import Iterable
from typing import Any

import torch

from batchfit.policy.noise.noise_scale import GradientReading
from batchfit.policy.plan.noise_monitor import MonitorUpdate, NoiseScaleMonitor
from batchfit.runtime.distributed.lockstep import Lockstep
from batchfit.runtime.steps.gradient_noise import AccumulationNoise
from batchfit.runtime.steps.learning_rate import scale_learning_rate

logger = logging.getLogger(__name__)


class StepNoise:
    """Reads one ``GradientReading`` per optimizer step whose micro-batches are two or more of one
    size (a step of one micro-batch, or with a shorter last one, gives none), and feeds ``monitor``.

    Under a process group each rank reads its own micro-batches against its own accumulated batch,
    before the gradients are averaged over the ranks, and the ranks' squared norms are averaged
    (one exchange of two numbers per step): the reading is of a micro-batch against a rank's
    batch, the global batch's noise scale all the same (both parts are free of the batch size).
    """

    def __init__(
        self,
        monitor: NoiseScaleMonitor,
        parameters: Iterable[torch.nn.Parameter],
        scaler: Any,
        lockstep: Lockstep | None,
    ) -> None:
        self.monitor, self.scaler, self.lockstep = monitor, scaler, lockstep
        self.parameters = list(parameters)
        self.collector: AccumulationNoise | None = None  # made at the first step that reads
        self.reading = False  # whether this attempt's micro-batches are read
        self.warned = False  # that a batch of one micro-batch gives no reading

    def begin(self, sizes: list[int], *, even: bool = True) -> None:
        """An attempt at the step starts, as micro-batches of ``sizes``; ``even``: their losses are
        weighted alike (a token mean whose micro-batches hold different numbers of tokens is not,
        and a reading of it would weight them as if it were)."""
        self.reading = len(sizes) >= 2 and len(set(sizes)) == 1 and even
        if len(sizes) == 1 and not self.warned:
            self.warned = True
            if self.lockstep is None or self.lockstep.rank == 0:
                logger.warning(
                    f"MicroBatchStep reads no noise scale from a batch of {sizes[0]} samples: it runs as "
                    f"one micro-batch, and the noise scale compares a micro-batch with the batch of two or "
                    f"more; pass a micro_batch_size of at most half the batch ({sizes[0] // 2 or 1})."
                )
        if not self.reading:
            return
        if self.collector is None:
            self.collector = AccumulationNoise(self.parameters, sizes[0], scaler=self.scaler)
        self.collector.micro_batch_size = sizes[0]

    def after_backward(self) -> None:
        if self.reading and self.collector is not None:
            self.collector.after_backward()

    def drop(self) -> None:
        """After an out-of-memory: the attempt's reading and the gradient copy go (it frees memory)."""
        self.collector = None

    def end_step(self) -> GradientReading | None:
        """The step's reading, the ranks' averaged (every rank calls it after the same micro-batches);
        before anything changes the gradients."""
        local = self.collector.end_step() if self.reading and self.collector is not None else None
        if self.lockstep is None or not self.reading:
            return local
        gathered = self.lockstep.run(lambda: local)
        readings = [reading for reading in gathered if reading is not None]
        if len(readings) < len(gathered):  # a rank's gradients were not finite
            return None
        return GradientReading(
            readings[0].small_batch_size,
            readings[0].big_batch_size,
            statistics.fmean(reading.small_norm_sq for reading in readings),
            statistics.fmean(reading.big_norm_sq for reading in readings),
        )

    def record(
        self,
        reading: GradientReading,
        optimizer_step: int,
        optimizer: torch.optim.Optimizer,
        schedulers: Iterable[Any],
    ) -> MonitorUpdate | None:
        """Feed ``reading`` to the monitor; apply the change it reports to the learning rate."""
        world_size = 1 if self.lockstep is None else self.lockstep.world_size
        micro = reading.small_batch_size
        report = self.monitor.record(
            reading,
            optimizer_step=optimizer_step,
            accumulation_steps=reading.big_batch_size // micro,
            micro_batch_size=micro,
            world_size=world_size,
            optimizer=type(optimizer).__name__,
        )
        if report is not None and report.change is not None:
            scale_learning_rate(optimizer, report.change.learning_rate_factor, schedulers)
        return report

    def after_step(
        self,
        reading: GradientReading,
        optimizer_step: int,
        optimizer: torch.optim.Optimizer,
        schedulers: Iterable[Any],
        log: logging.Logger,
        samples: int,
    ) -> int:
        """Record the step's ``reading``; the per-device batch to feed from the next step on:
        ``samples`` (this step's), or after a change the batch it asks for. A report goes to ``log``
        (rank 0): INFO, or WARNING with a change."""
        report = self.record(reading, optimizer_step, optimizer, schedulers)
        if report is None:
            return samples
        batch_size = self.batch_size_after(report, samples)
        if self.lockstep is None or self.lockstep.rank == 0:
            log.log(
                logging.INFO if report.change is None else logging.WARNING, report_line(report, batch_size)
            )
        return batch_size

    def batch_size_after(self, report: MonitorUpdate, samples: int) -> int:
        """The per-device batch to feed from the next step on: ``samples`` (this step's), or after
        the report's change the batch it asks for."""
        world_size = 1 if self.lockstep is None else self.lockstep.world_size
        return samples if report.change is None else report.change.new_global_batch_size // world_size


def report_line(report: MonitorUpdate, batch_size: int) -> str:
    """The report as ``MicroBatchStep`` logs it; after a change, with the per-device batch it asks for."""
    asks = "" if report.change is None else f"; feed batches of {batch_size} samples per device from now on"
    return f"MicroBatchStep: {report.line()}{asks}."

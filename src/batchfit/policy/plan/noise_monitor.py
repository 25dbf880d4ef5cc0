"""The gradient noise scale during training, free of torch: the readings of the last optimizer steps
estimated every N steps, a running average of its two parts, and the schedule's decision on them.
``MicroBatchStep`` and the Lightning and Hugging Face callbacks feed it one reading per optimizer
step and log what it reports."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Any

from batchfit.checks import check_positive_int
from batchfit.errors import ConfigurationError
from batchfit.policy.noise.noise_scale import GradientReading, NoiseScale, estimate
from batchfit.policy.plan.batch_schedule import BatchSchedule, ScheduleChange


class NoiseScaleAverage:
    """Exponential moving averages of ``|G|^2`` and ``tr(Sigma)``, each reading's unbiased estimates,
    kept apart and divided when asked (the ratio of one step is too noisy to average). Both are free
    of the batch size, so the averages run on across a change of the batch. Bias-corrected as in
    Adam: the first reading's weight is not lost to the zero they start from."""

    def __init__(self, decay: float) -> None:
        if not 0 <= decay < 1:
            raise ConfigurationError(
                f"decay ({decay}) must be in [0, 1): the weight the average keeps per reading "
                f"(0: the last reading alone)."
            )
        self.decay = decay
        self.signal = self.noise = 0.0  # the averages, not yet bias-corrected
        self.readings = 0

    def add(self, reading: GradientReading) -> None:
        self.signal = self.decay * self.signal + (1 - self.decay) * reading.signal()
        self.noise = self.decay * self.noise + (1 - self.decay) * reading.noise()
        self.readings += 1

    @property
    def b_simple(self) -> float:
        """``tr(Sigma) / |G|^2`` of the averages; ``inf`` where the averaged signal is not positive
        (the bias correction divides both alike, so it cancels in the ratio)."""
        return self.noise / self.signal if self.readings and self.signal > 0 else math.inf


@dataclass(frozen=True)
class MonitorUpdate:
    """What the monitor says every ``every`` optimizer steps: the ``noise_scale`` over its window (a
    ``NoiseScale``, the one type every noise scale is passed and reported as), the running
    average, and the schedule's change (None: none)."""

    optimizer_step: int  # the step (0-based) whose reading completed the window
    noise_scale: NoiseScale
    smoothed: float  # B_simple of the running averages (inf: unresolved)
    change: ScheduleChange | None

    def line(self) -> str:
        """One line for a log."""
        noise = self.noise_scale
        interval = f", 90% {noise.low:.4g}-{noise.high:.4g}" if noise.low is not None else ""
        value = f"{noise.b_simple:.4g}" if noise.resolved else "unresolved"
        smoothed = f"{self.smoothed:.4g}" if math.isfinite(self.smoothed) else "unresolved"
        line = (
            f"B_simple {value}{interval} over {noise.steps} steps at batch sizes "
            f"{noise.small_batch_size} and {noise.big_batch_size} (optimizer step {self.optimizer_step}; "
            f"running average {smoothed})"
        )
        return line if self.change is None else f"{line}; {self.change.summary()}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "optimizer_step": self.optimizer_step,
            "noise_scale": self.noise_scale.to_dict(),
            "smoothed": self.smoothed if math.isfinite(self.smoothed) else None,
            "change": None if self.change is None else self.change.to_dict(),
        }


class NoiseScaleMonitor:
    """Estimates the noise scale every ``every`` optimizer steps over the last ``window`` readings at
    the current batch sizes (default ``every``, or the schedule's ``min_steps`` if larger), keeps a
    running average with ``decay`` per step (default ``1 - 1/every``), and, with a ``schedule``,
    asks it whether to grow the batch. Readings at other batch sizes than the window's start a new
    window; so does a change.
    """

    def __init__(
        self,
        every: int = 100,
        *,
        schedule: BatchSchedule | None = None,
        window: int | None = None,
        decay: float | None = None,
    ) -> None:
        check_positive_int("every", every)
        floor = schedule.min_steps if schedule is not None else 1
        window = max(every, floor) if window is None else check_positive_int("window", window)
        if window < floor:
            raise ConfigurationError(
                f"window ({window}) is below the schedule's min_steps ({floor}): the schedule could never "
                f"decide; raise window or lower min_steps."
            )
        self.every, self.schedule, self.window = every, schedule, window
        self.average = NoiseScaleAverage(1 - 1 / every if decay is None else decay)
        self.readings: deque[GradientReading] = deque(maxlen=window)
        self.latest: MonitorUpdate | None = None
        self.changes: list[ScheduleChange] = []
        self._steps = 0  # readings recorded

    @property
    def noise_scale(self) -> NoiseScale | None:
        """The noise scale over the last window (None before the first report): a ``NoiseScale``
        that ``Goal`` and ``Checklist`` take as it is."""
        return None if self.latest is None else self.latest.noise_scale

    def record(
        self,
        reading: GradientReading,
        *,
        optimizer_step: int,
        accumulation_steps: int,
        micro_batch_size: int,
        world_size: int = 1,
        optimizer: str | None = None,
    ) -> MonitorUpdate | None:
        """Add optimizer step ``optimizer_step``'s reading; every ``every`` readings, the update
        (and the change, which the caller applies from the next step on)."""
        if self.readings and _sizes(self.readings[0]) != _sizes(reading):
            self.readings.clear()
        self.readings.append(reading)
        self.average.add(reading)
        self._steps += 1
        if self._steps % self.every:
            return None
        evidence = estimate(self.readings)
        change = None
        if self.schedule is not None:
            change = self.schedule.decide(
                evidence,
                optimizer_step=optimizer_step + 1,
                accumulation_steps=accumulation_steps,
                micro_batch_size=micro_batch_size,
                world_size=world_size,
                optimizer=optimizer,
            )
        if change is not None:
            self.changes.append(change)
            self.readings.clear()
        self.latest = MonitorUpdate(optimizer_step, evidence, self.average.b_simple, change)
        return self.latest


def _sizes(reading: GradientReading) -> tuple[int, int]:
    return reading.small_batch_size, reading.big_batch_size

"""Explore's meter on a real device: windows of training steps timed at several batch sizes in turn
(``timed_steps``, as the trials run them), the model's state put back as it goes and at the end."""

from __future__ import annotations

import math
import time
from typing import Any

import torch

from batchfit.runtime.devices.device import Device
from batchfit.runtime.steps.state import TrainingSnapshot
from batchfit.runtime.steps.stepping import step_until_settled, timed_steps
from batchfit.runtime.workloads.workload import Workload

#: With ``steps_per_window=None``, a timing window is the fewest steps that last this long.
MIN_WINDOW_SECONDS = 0.02


class StepTimer:
    """Explore's meter on a real device: training windows at several batch sizes in turn, the
    weights put back every ``restore_every`` steps (a long exploration must not train the model
    into another regime) and, with the gradients, on ``close``.

    A window is ``steps_per_window`` steps or, when None, the fewest (at least
    ``min_window_steps``, the device's unless given) that last ``min_window_seconds`` (set by the
    first, discarded window). Throughput is per sample, or per token with ``tokens_per_sample``.
    """

    def __init__(
        self,
        workload: Workload,
        device: Device,
        steps_per_window: int | None = None,
        tokens_per_sample: int | None = None,
        *,
        min_window_seconds: float = MIN_WINDOW_SECONDS,
        min_window_steps: int | None = None,
        restore_every: int = 32,
    ) -> None:
        self.workload, self.device, self.fixed_steps = workload, device, steps_per_window
        self.min_window_steps = min_window_steps or device.min_window_steps
        self.tokens = tokens_per_sample or 1
        self.min_window_seconds, self.restore_every = min_window_seconds, restore_every
        optimizer = workload.optimizer if isinstance(workload.optimizer, torch.optim.Optimizer) else None
        self.snapshot = TrainingSnapshot.capture(workload.module, optimizer, workload.functions)
        self.scalers = [state.scaler for state in self.snapshot.scalers]
        self.compiled = bool(workload.compiled)  # read once: it walks the model
        self.snapshot.set_gradients_aside()
        self.optimizer = workload.build_optimizer()
        self.batches: dict[int, Any] = {}
        self.steps: dict[int, int] = {}
        self.unrestored_steps = 0
        self.stepping_seconds = 0.0  # every step this timer ran, warm-ups and discarded windows too

    def now(self) -> float:
        return time.perf_counter()

    def first_visit(self, batch_size: int) -> None:
        """A warm-up step for this shape, then a first window that is discarded and sets the
        window's length in steps. The warm-up steps on while a GradScaler's scale comes down (up
        to ``OVERFLOW_STEPS``): a fresh scaler's first fp16 steps overflow and skip the optimizer,
        faster than training's steps, and the window would time them."""
        self.workload.module.train()
        self.batches[batch_size] = self.workload.host_batch(batch_size)
        step_until_settled(self.scalers, lambda: self._run(batch_size, 1))
        first = self.fixed_steps or self.min_window_steps
        seconds = self._run(batch_size, first)
        self.steps[batch_size] = self.fixed_steps or max(
            self.min_window_steps, math.ceil(self.min_window_seconds * first / seconds)
        )

    def use_window_steps(self, batch_size: int, steps: int) -> None:
        """Time ``steps`` steps per window at ``batch_size`` from now on (the ranks of a lockstep
        exploration agree on the longest any of them chose)."""
        self.steps[batch_size] = steps

    def resume(self, batch_size: int, steps: int) -> None:
        """Time windows of ``steps`` steps at ``batch_size`` with no warm-up: the window's length
        was set by an earlier timer's first visit to the same variant and shape."""
        self.workload.module.train()
        self.batches[batch_size] = self.workload.host_batch(batch_size)
        self.steps[batch_size] = steps

    def step_seconds(self, batch_size: int) -> float:
        """One step's seconds at ``batch_size``, untimed by any window (a probe)."""
        self.workload.module.train()
        self.batches.setdefault(batch_size, self.workload.host_batch(batch_size))
        return self._run(batch_size, 1)

    def revisit(self, batch_size: int) -> None:
        """One untimed step: the first step after another shape runs slower."""
        self._run(batch_size, 1)

    def window(self, batch_size: int) -> float:
        steps = self.steps[batch_size]
        return batch_size * self.tokens * steps / self._run(batch_size, steps)

    def end_round(self) -> None:
        """Put the weights back every ``restore_every`` steps or so (a restore copies every
        weight and optimizer state: too costly after each window of a small model)."""
        if self.unrestored_steps >= self.restore_every:
            self.snapshot.restore(gradients=False, scales=False)
            self.unrestored_steps = 0

    def close(self) -> None:
        self.batches.clear()
        self.snapshot.restore(gradients=True)
        self.device.release()

    def __enter__(self) -> StepTimer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self, batch_size: int, count: int) -> float:
        self.unrestored_steps += count
        seconds = timed_steps(
            self.workload,
            self.optimizer,
            self.device,
            "train",
            self.batches[batch_size],
            count,
            compiled=self.compiled,
        )
        self.stepping_seconds += seconds
        return seconds

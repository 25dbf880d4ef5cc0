"""The data-loading check's measurements: a DataLoader alone, the training step alone, and the two
together as training runs them, each pass within its share of the check's time budget and telling
its ``Pace`` after every batch. Each pass puts the weights, optimizer and RNG back after it, and
``close`` leaves them (and the gradients) as the check found them."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import torch
from torch.utils.data import DataLoader

from batchfit.policy.explore.loader_settings import LoaderSetting, SettingRow
from batchfit.policy.explore.time_budget import TimeBudget
from batchfit.runtime.data.dataloaders import LoaderSource, batches_per_epoch
from batchfit.runtime.devices.device import Device
from batchfit.runtime.steps.state import TrainingSnapshot
from batchfit.runtime.steps.stepping import step_until_settled, timed_steps
from batchfit.runtime.workloads.batches import to_device
from batchfit.runtime.workloads.workload import Workload

#: A timed window holds at least this many batches, however long they take (unless its share of
#: the time budget is spent first).
MIN_TIMED_BATCHES = 5
#: The step alone runs its timed steps in runs of about this many seconds, telling the pace after each.
PROGRESS_SECONDS = 2.0


class Pace(Protocol):
    """What a pass answers to: the check's time budget, and whoever hears its progress."""

    def begin(self, what: str, share: float) -> TimeBudget:
        """Pass ``what`` begins; its budget is ``share`` of what is left of the check's."""
        ...

    def batch(self, batches: int) -> None:
        """After each batch or step, warm-up included (``batches``: timed so far)."""
        ...


class Unpaced:
    """No budget and nobody to tell."""

    def begin(self, what: str, share: float) -> TimeBudget:
        return TimeBudget(None)

    def batch(self, batches: int) -> None:
        pass


class StepClock(Protocol):
    """Times the training steps of a window as the device sees them."""

    def begin(self) -> None: ...

    def end(self) -> None: ...

    def busy_seconds(self) -> float:
        """The steps' total seconds (the device synchronised first, where it runs ahead)."""
        ...


class HostStepClock:
    """On the CPU the step runs on the host: its wall time is the device's busy time."""

    def __init__(self) -> None:
        self.seconds, self.started = 0.0, 0.0

    def begin(self) -> None:
        self.started = time.perf_counter()

    def end(self) -> None:
        self.seconds += time.perf_counter() - self.started

    def busy_seconds(self) -> float:
        return self.seconds


class CudaStepClock:
    """CUDA events around each step on the device's current stream: the stream's time inside the
    steps, read once the window has synchronised."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.pairs: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self.started: torch.cuda.Event | None = None

    def _record(self) -> torch.cuda.Event:
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))
        return event

    def begin(self) -> None:
        self.started = self._record()

    def end(self) -> None:
        if self.started is not None:
            self.pairs.append((self.started, self._record()))

    def busy_seconds(self) -> float:
        torch.cuda.synchronize(self.device)
        return sum(float(start.elapsed_time(end)) for start, end in self.pairs) / 1000


class Epochs:
    """A loader's batches across epochs, as a training loop's ``for epoch`` reads them: a new
    epoch (with new workers, unless persistent) when one ends. The first batch is read on
    creation; ``startup_seconds`` is the time from ``iter(loader)`` to it."""

    def __init__(self, loader: DataLoader[Any]) -> None:
        self.loader = loader
        started = time.perf_counter()
        self.iterator: Iterator[Any] = iter(loader)
        self.first = next(self.iterator)
        self.startup_seconds = time.perf_counter() - started

    def next(self) -> Any:
        try:
            return next(self.iterator)
        except StopIteration:
            self.iterator = iter(self.loader)
            return next(self.iterator)


class DataLoop:
    """The passes of the check on one workload and device, each a window of at least
    ``window_seconds`` and ``MIN_TIMED_BATCHES`` batches after an untimed warm-up round (one batch
    per worker, one without workers: the workers' start and their first batches, which arrive
    together). A window whose share of the budget is spent ends after the batch it has (one at
    least), so a tight budget shortens the windows rather than being overrun by them."""

    def __init__(
        self,
        workload: Workload,
        device: Device,
        source: LoaderSource,
        window_seconds: float,
        pace: Pace | None = None,
    ) -> None:
        self.workload, self.device, self.source = workload, device, source
        self.window_seconds = window_seconds
        self.pace: Pace = Unpaced() if pace is None else pace
        optimizer = workload.optimizer if isinstance(workload.optimizer, torch.optim.Optimizer) else None
        self.snapshot = TrainingSnapshot.capture(workload.module, optimizer, workload.functions)
        self.scalers = [state.scaler for state in self.snapshot.scalers]
        self.snapshot.set_gradients_aside()
        self.optimizer = workload.build_optimizer()
        self.host_batch: Any = None  # the first batch the loader gave, for the step alone
        self.batches_per_epoch: int | None = None
        self.torch_device = device.torch_device
        self.compiled = bool(workload.compiled)  # read once: it walks the model

    def loader_alone(self, setting: LoaderSetting, share: float = 1.0) -> float:
        """Samples/s of the loader iterated with nothing else running."""
        budget = self.pace.begin(f"the loader alone at {setting.describe()}", share)
        epochs = self._start(setting)
        samples, batches = 0, 0
        begin = time.perf_counter()
        while not self._window_done(begin, batches, budget):
            samples += self.source.samples(epochs.next())
            batches += 1
            self.pace.batch(batches)
        return samples / (time.perf_counter() - begin)

    def step_alone(self, share: float = 1.0) -> float:
        """Samples/s of training steps on one batch already in memory: the first batch the loader
        gave (a pass has read it), each step on a fresh device copy of it, as in training. The
        steps run in runs of about ``PROGRESS_SECONDS``, the pace told after each."""
        samples = self.source.samples(self.host_batch)
        budget = self.pace.begin("the step alone", share)
        try:
            self.workload.module.train()
            step_until_settled(self.scalers, lambda: self._train(self.host_batch))  # warm-up
            one = self._steps(1)
            self.pace.batch(0)
            count = max(MIN_TIMED_BATCHES, math.ceil(self.window_seconds / one))
            if not math.isinf(budget.left()):  # as many as the pass's share of the budget holds
                count = max(1, min(count, math.floor(budget.left() / one)))
            run = max(1, math.floor(PROGRESS_SECONDS / one))
            seconds, done = 0.0, 0
            while done < count:
                steps = min(run, count - done)
                seconds += self._steps(steps)
                done += steps
                self.pace.batch(done)
            return samples * count / seconds
        finally:
            self._put_back()

    def together(self, setting: LoaderSetting, share: float = 1.0) -> tuple[SettingRow, float]:
        """``setting``'s row, the loader feeding real training steps, and the share of the window
        the device was busy in the steps."""
        budget = self.pace.begin(f"the loader feeding the step at {setting.describe()}", share)
        try:
            self.workload.module.train()
            epochs = self._start(setting, warm=self._train)
            clock: StepClock = (
                CudaStepClock(self.torch_device) if self.torch_device.type == "cuda" else HostStepClock()
            )
            waited, samples, batches = 0.0, 0, 0
            self.device.synchronize()
            begin = time.perf_counter()
            while not self._window_done(begin, batches, budget):
                before = time.perf_counter()
                batch = epochs.next()
                on_device = to_device(batch, self.torch_device, non_blocking=setting.pin_memory)
                waited += time.perf_counter() - before
                clock.begin()
                self._step(on_device)
                clock.end()
                samples += self.source.samples(batch)
                batches += 1
                self.pace.batch(batches)
            self.device.synchronize()
            wall = time.perf_counter() - begin
            row = SettingRow(setting, samples / wall, min(1.0, waited / wall), epochs.startup_seconds)
            return row, min(1.0, clock.busy_seconds() / wall)
        finally:
            self._put_back()

    def close(self) -> None:
        self.host_batch = None
        self.snapshot.restore(gradients=True)
        self.device.release()

    def __enter__(self) -> DataLoop:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the pieces ----------------------------------------------------------------------

    def _start(self, setting: LoaderSetting, warm: Callable[[Any], None] | None = None) -> Epochs:
        """A new loader at ``setting``, its start timed, and its warm-up round read (and trained
        on, with ``warm``)."""
        loader = self.source.build(setting)
        epochs = Epochs(loader)
        if self.host_batch is None:
            self.source.samples(epochs.first, first=True)
            self.host_batch = epochs.first
            self.batches_per_epoch = batches_per_epoch(loader)
        if warm is not None:
            warm(epochs.first)
        self.pace.batch(0)
        for _ in range(max(1, setting.num_workers) - 1):
            batch = epochs.next()
            if warm is not None:
                warm(batch)
            self.pace.batch(0)
        return epochs

    def _window_done(self, begin: float, batches: int, budget: TimeBudget) -> bool:
        if batches >= 1 and budget.left() <= 0:
            return True
        return batches >= MIN_TIMED_BATCHES and time.perf_counter() - begin >= self.window_seconds

    def _train(self, host_batch: Any) -> None:
        self._step(to_device(host_batch, self.torch_device))

    def _step(self, batch: Any) -> None:
        try:
            self.workload.run_train_step(self.optimizer, batch)
        except BaseException as error:
            self._note(error)
            raise

    def _steps(self, count: int) -> float:
        try:
            return timed_steps(
                self.workload,
                self.optimizer,
                self.device,
                "train",
                self.host_batch,
                count,
                compiled=self.compiled,
            )
        except BaseException as error:
            self._note(error)
            raise

    def _note(self, error: BaseException) -> None:
        error.add_note(
            f"batchfit: raised by the train step in check_data at batch_size={self.source.batch_size}."
        )

    def _put_back(self) -> None:
        """The weights, optimizer state and RNG as before the pass (gradients stay set aside)."""
        self.snapshot.restore(gradients=False, scales=False)

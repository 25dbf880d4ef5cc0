"""The one place that runs a workload's steps on a device: trials (memory, under a cap, the state
put back after each) and timing windows (explore's throughput) are two uses of ``timed_steps``."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import replace
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from batchfit.policy.allocation_record import AllocationRecord
from batchfit.policy.steady import RecurrenceWatch
from batchfit.policy.trial import Mode, Trial
from batchfit.policy.trial_cache import verdict
from batchfit.runtime.devices.device import Device, Measurement
from batchfit.runtime.devices.oom import is_out_of_memory
from batchfit.runtime.devices.tracker import resident_tensors
from batchfit.runtime.steps.compiled import recompiles_allowed
from batchfit.runtime.steps.state import TrainingSnapshot
from batchfit.runtime.workloads.workload import Workload, to_device

#: With ``steps_per_window=None``, a timing window is the fewest steps that last this long.
MIN_WINDOW_SECONDS = 0.02
#: The most steps a trial adds while its GradScalers skip every optimizer step for overflow: each
#: skip halves the scale, and 24 halvings take the default 65536 to 1/256.
OVERFLOW_STEPS = 24


def timed_steps(
    workload: Workload,
    optimizer: torch.optim.Optimizer | None,
    device: Device,
    mode: Mode,
    host_batch: Any,
    count: int,
    *,
    compiled: bool,
) -> float:
    """Run ``count`` steps of ``mode``, each on a fresh device copy of ``host_batch`` (as a data
    loader hands training a new batch), and return their seconds, the device synchronised;
    ``compiled``: the steps run ``torch.compile``'d code (``Workload.compiled``, read once by the
    caller: it walks the model)."""
    device.synchronize()
    begin = time.perf_counter()
    with recompiles_allowed(compiled):  # each batch size may compile its own graph
        for _ in range(count):
            batch = to_device(host_batch, device.torch_device)
            if mode == "train":
                workload.run_train_step(optimizer, batch)
            else:
                workload.run_eval_step(batch)
            del batch
    device.synchronize()
    return max(time.perf_counter() - begin, 1e-9)


def run_steps(
    workload: Workload,
    optimizer: torch.optim.Optimizer | None,
    device: Device,
    mode: Mode,
    host_batch: Any,
    steps: int,
    warm_batch: int | None,
    cap_bytes: int | None = None,
    started: list[Measurement] | None = None,
    until_steady: bool = False,
    record: bool = False,
    scalers: Sequence[torch.amp.GradScaler] = (),
    record_steps: int | None = None,
) -> tuple[Measurement, float | None]:
    """Run ``steps`` steps of ``mode`` on copies of ``host_batch`` under a hard cap of ``cap_bytes``
    (none when None); the measurement of the last step and its seconds. With ``warm_batch``, an
    eval trial first makes the training state resident (gradients, optimizer state), under the
    same cap. The measurement is also appended to ``started`` as it begins, so a failure can
    read it. With ``until_steady``, the steps end early where the device's allocator state after a
    step recurs (``policy.steady``): the steps left would repeat steps that ran. With ``record``,
    the allocator's requests are taken down step by step (``measurement.recording``), over the
    first ``record_steps`` steps (None: all; on CUDA reading the history costs, each step). Where the
    step's GradScalers (``scalers``) skipped every optimizer step for overflow, more steps run, up
    to ``OVERFLOW_STEPS``, until one is taken: the optimizer's state is part of a training step."""
    # What the steps start with, counted as the block opens and not kept: a tensor they replace
    # (L-BFGS's history, a buffer assigned anew) is freed, as in training.
    resident = resident_tensors(workload.module, optimizer, *workload.reached)
    compiled, wrapper_bytes = bool(workload.compiled), workload.wrapper_bytes
    step_seconds: float | None = None
    # A 2-step trial cannot end before its second step, where a recurrence is first seen.
    watch = RecurrenceWatch(needs_optimizer_step=mode == "train") if until_steady and steps > 2 else None
    with (
        device.measure(resident, cap_bytes, compiled=compiled, wrapper_bytes=wrapper_bytes) as measurement,
        _optimizer_phases(measurement),
        ExitStack() as recorder,  # closed after ``record_steps`` steps: the recording ends there
    ):
        recording = recorder.enter_context(device.recording()) if record else None
        if started is not None:
            started.append(measurement)
        measurement.recording = recording
        if mode == "eval" and warm_batch is not None and optimizer is not None:
            # Validation inside training runs with gradients and optimizer state resident: the
            # training step steps on while overflow skips its optimizer, else no optimizer state
            # is there (an overflowing fp16 scaler's eval answer was 680 where 386 holds it).
            workload.module.train()
            warm = to_device(workload.host_batch(warm_batch), device.torch_device)
            step_until_settled(scalers, lambda: workload.run_train_step(optimizer, warm))
            del warm
        workload.module.train(mode == "train")
        scales = [scaler.get_scale() for scaler in scalers]
        step = 0
        while step < steps or (  # a train step whose overflowing gradients skipped the optimizer
            mode == "train"
            and step < steps + OVERFLOW_STEPS
            and measurement.optimizer_steps == 0
            and _scaled_down(scalers, scales)
        ):
            step += 1
            if recording is not None and record_steps is not None and step > record_steps:
                recorder.close()  # what it took down stays in measurement.recording
                recording = None
            measurement.begin_step()
            if recording is not None:
                recording.mark_step()
            measurement.steps = step
            optimizer_steps = measurement.optimizer_steps
            step_seconds = timed_steps(workload, optimizer, device, mode, host_batch, 1, compiled=compiled)
            if watch is not None and step < steps:
                stepped = measurement.optimizer_steps > optimizer_steps
                measurement.steady_from = watch.after_step(device.allocator_state(), stepped)
                if measurement.steady_from is not None:
                    break
    return measurement, step_seconds


def step_until_settled(scalers: Sequence[torch.amp.GradScaler], step: Callable[[], object]) -> None:
    """Run ``step`` (a training step) once, and again while a GradScaler's scale comes down, up to
    ``OVERFLOW_STEPS`` more: a fresh scaler's first fp16 steps overflow and skip the optimizer,
    cheaper than training's steps, so a meter warms up past them before it times any."""
    for _ in range(1 + OVERFLOW_STEPS):
        scales = [scaler.get_scale() for scaler in scalers]
        step()
        if not _scaled_down(scalers, scales):
            return


def _scaled_down(scalers: Sequence[torch.amp.GradScaler], before: list[float]) -> bool:
    """Whether a GradScaler's scale came down: it skipped a step for overflowing gradients."""
    return any(scaler.get_scale() < scale for scaler, scale in zip(scalers, before, strict=True))


def judge(batch_size: int, measurement: Measurement, step_seconds: float | None, budget_bytes: int) -> Trial:
    """The trial a completed measurement makes: ok if its peak is within the budget, else over
    budget. (A trial that completed under a cap at the budget is within it.)"""
    outcome, detail = verdict(measurement.peak_bytes, budget_bytes)
    return Trial(
        batch_size,
        outcome,
        measurement.peak_bytes,
        step_seconds,
        detail,
        optimizer_peak_bytes=measurement.optimizer_peak_bytes,
        activation_peak_bytes=measurement.activation_peak_bytes,
        allocator_retries=measurement.allocator_retries,
        reserved_peak_bytes=measurement.reserved_peak_bytes,
    )


class TrialRunner:
    """Runs real trials on a device under a hard cap at the budget, each from the workload's
    resident state, restoring the snapshot after each, failed or not.

    The verdict is whether the steps complete under the cap: a batch that does not fit fails at
    its real allocation, as it would in training on a device of ``budget_bytes``; allocator
    retries on the way are evidence (they cost speed), not a failure. On a caching allocator the
    steps end where its state recurs (``until_steady``): the steps left would repeat earlier ones.
    With ``record``, each trial that fits leaves its allocator requests (of its first
    ``record_steps`` steps, None: all) in ``records`` (by batch
    size), for ``policy.allocation_replay`` to forecast other sizes.
    """

    def __init__(
        self,
        workload: Workload,
        device: Device,
        mode: Mode,
        steps: int,
        budget_bytes: int,
        snapshot: TrainingSnapshot,
        warm_batch: int | None,
        *,
        until_steady: bool = True,
        record: bool = False,
        record_steps: int | None = None,
    ) -> None:
        self.workload, self.device, self.mode, self.steps = workload, device, mode, steps
        self.budget_bytes, self.snapshot, self.warm_batch = budget_bytes, snapshot, warm_batch
        self.until_steady, self.record, self.record_steps = until_steady, record, record_steps
        self.records: dict[int, AllocationRecord] = {}
        # The step's GradScalers, as the snapshot found them: it puts them back, the trials read them.
        self.scalers = [state.scaler for state in snapshot.scalers]

    def run(self, batch_size: int) -> Trial:
        host_batch = self.workload.host_batch(batch_size)  # outside the measurement: data-loader memory
        scales = [scaler.get_scale() for scaler in self.scalers]
        trial, stepped = self._attempt(batch_size, host_batch)
        if trial.fits and stepped and _scaled_down(self.scalers, scales):
            # Its GradScaler skipped steps for overflow (a fresh scaler's first steps do) before
            # the optimizer stepped, and every later trial starts from the scale it came down to
            # (the scale is not put back): their steps hold the optimizer's state from the first.
            # Run again from there, so that this trial's peak and recorded requests are theirs.
            # The first attempt's ran other steps, and its requests do not align with theirs:
            # replayed, they forecast nothing (an AMP search on an H200 replayed no size). The
            # same steps on the same batch from the same weights do not overflow again.
            self.records.pop(batch_size, None)
            trial, _ = self._attempt(batch_size, host_batch)
        return trial

    def _attempt(self, batch_size: int, host_batch: Any) -> tuple[Trial, bool]:
        """The trial, and whether an optimizer stepped in it."""
        workload = self.workload
        self.device.release()  # nothing an earlier trial (or the caller) left cached counts here
        started: list[Measurement] = []
        step_seconds, failure = None, ""
        try:
            _, step_seconds = run_steps(
                workload,
                workload.build_optimizer(),
                self.device,
                self.mode,
                host_batch,
                self.steps,
                self.warm_batch,
                self.budget_bytes,
                started,
                self.until_steady,
                self.record,
                self.scalers,
                self.record_steps,
            )
        except BaseException as error:
            refused = started[0].refused if started else ""
            if not (is_out_of_memory(error) or (refused and isinstance(error, RuntimeError))):
                error.add_note(f"batchfit: raised by the {self.mode} step at batch_size={batch_size}.")
                raise
            if is_out_of_memory(error):
                text = str(error).strip()
                failure = text.splitlines()[0] if text else type(error).__name__
            else:  # the cap's own message, where what reached here lost it (TorchScript re-raises it empty)
                failure = refused
        finally:
            self.snapshot.restore(gradients=False, scales=False)
        measurement = started[0] if started else Measurement()
        if failure:
            self.device.release()
            return Trial(
                batch_size,
                "oom",
                measurement.peak_bytes,
                None,
                failure,
                allocator_retries=measurement.allocator_retries,
                reserved_peak_bytes=measurement.reserved_peak_bytes,
                steps=self.steps,
                failed_at_step=measurement.steps,
            ), measurement.optimizer_steps > 0
        trial = judge(batch_size, measurement, step_seconds, self.budget_bytes)
        record = measurement.recording.record(batch_size) if measurement.recording is not None else None
        if record is not None and trial.fits:
            self.records[batch_size] = record
        trial = replace(trial, steps=measurement.steps, steady_from=measurement.steady_from)
        return trial, measurement.optimizer_steps > 0


@contextmanager
def _optimizer_phases(measurement: Measurement) -> Iterator[None]:
    """Tell the measurement when any optimizer's step starts and ends (global hooks, removed after)."""
    before = register_optimizer_step_pre_hook(lambda *_: measurement.enter_optimizer_step())
    after = register_optimizer_step_post_hook(lambda *_: measurement.exit_optimizer_step())
    try:
        yield
    finally:
        before.remove()
        after.remove()


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
        return timed_steps(
            self.workload,
            self.optimizer,
            self.device,
            "train",
            self.batches[batch_size],
            count,
            compiled=self.compiled,
        )

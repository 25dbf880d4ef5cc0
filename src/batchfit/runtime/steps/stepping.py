"""Running a workload's steps on a device, from one ``StepSpec``: ``run_steps`` runs a trial's steps
under a cap and measures them; ``timed_steps`` times steps as explore's meter and the data check run
them."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from batchfit.policy.allocator.steady import RecurrenceWatch
from batchfit.policy.search.trial import Mode
from batchfit.runtime.devices.device import Device
from batchfit.runtime.devices.measurement import Measurement
from batchfit.runtime.devices.tracker import resident_tensors
from batchfit.runtime.distributed.buckets import BucketLayout, trial_buckets
from batchfit.runtime.steps.compiled import recompiles_allowed
from batchfit.runtime.steps.finite import LossLog
from batchfit.runtime.workloads.batches import to_device
from batchfit.runtime.workloads.workload import OnLoss, Workload

#: The most steps a trial adds while its GradScalers skip every optimizer step for overflow: each
#: skip halves the scale, and 24 halvings take the default 65536 to 1/256.
OVERFLOW_STEPS = 24


@dataclass(frozen=True)
class StepSpec:
    """What stays the same over a trial's steps (and over a search's trials): what runs, where,
    how many steps, under what cap, and what is taken down."""

    workload: Workload
    device: Device
    mode: Mode
    #: The steps a trial runs (fewer where ``until_steady`` ends it, more while overflow skips the optimizer).
    steps: int
    #: An eval trial first makes the training state resident (gradients, optimizer state) with a
    #: training step at this batch size, under the same cap; None: it does not.
    warm_batch: int | None = None
    #: The hard cap on the device's memory over the steps, in bytes; None: no cap.
    cap_bytes: int | None = None
    #: End the steps where the device's allocator state after a step recurs (``policy.allocator.steady``):
    #: the steps left would repeat steps that ran.
    until_steady: bool = False
    #: Take the allocator's requests down step by step (``Measurement.recording``).
    record: bool = False
    #: Record the first this many steps only (None: all; on CUDA reading the history costs, each step).
    record_steps: int | None = None
    #: The step's GradScalers: where they skip every optimizer step for overflow, more steps run.
    scalers: tuple[torch.amp.GradScaler, ...] = ()


def timed_steps(
    workload: Workload,
    optimizer: torch.optim.Optimizer | None,
    device: Device,
    mode: Mode,
    host_batch: Any,
    count: int,
    *,
    compiled: bool,
    on_loss: OnLoss | None = None,
) -> float:
    """Run ``count`` steps of ``mode``, each on a fresh device copy of ``host_batch`` (as a data
    loader hands training a new batch), and return their seconds, the device synchronised;
    ``compiled``: the steps run ``torch.compile``'d code (``Workload.compiled``, read once by the
    caller: it walks the model); ``on_loss`` hears each step's loss (``Workload.run_train_step``)."""
    device.synchronize()
    begin = time.perf_counter()
    with recompiles_allowed(compiled):  # each batch size may compile its own graph
        for _ in range(count):
            batch = to_device(host_batch, device.torch_device)
            if mode == "train":
                workload.run_train_step(optimizer, batch, on_loss)
            else:
                workload.run_eval_step(batch, on_loss)
            del batch
    device.synchronize()
    return max(time.perf_counter() - begin, 1e-9)


def run_steps(
    spec: StepSpec,
    optimizer: torch.optim.Optimizer | None,
    host_batch: Any,
    started: list[Measurement] | None = None,
    losses: LossLog | None = None,
) -> tuple[Measurement, float | None]:
    """Run ``spec``'s steps on copies of ``host_batch`` under its cap; the measurement of the last
    step and its seconds. The measurement is also appended to ``started`` as it begins, so a
    failure can read it; ``losses`` keeps each step's loss (made before, outside the measurement).
    Where the step's GradScalers skipped every optimizer step for overflow, more steps run, up to
    ``OVERFLOW_STEPS``, until one is taken: the optimizer's state is part of a training step."""
    workload = spec.workload
    # What the steps start with, counted as the block opens and not kept: a tensor they replace
    # (L-BFGS's history, a buffer assigned anew) is freed, as in training.
    resident = resident_tensors(workload.module, optimizer, *workload.reached)
    compiled, wrapper_bytes = bool(workload.compiled), workload.wrapper_bytes
    # A training trial rebuilds DDP's buckets where training does; a device that places them holds
    # tensors of its own for them (``runtime.distributed.buckets``), not their bytes as well.
    buckets = workload.buckets if spec.mode == "train" else BucketLayout()
    if buckets.rebuilds and spec.device.bucket_holding == "placed":
        wrapper_bytes = 0
    warming = spec.mode == "eval" and spec.warm_batch is not None and optimizer is not None
    # Collated on the host outside the cap, as the steps' batch is: a dataset's items may be views
    # of one tensor (a TensorDataset's), whose whole storage a collation inside would count.
    warm_host = workload.host_batch(spec.warm_batch) if warming and spec.warm_batch is not None else None
    with (
        spec.device.measure(
            resident, spec.cap_bytes, compiled=compiled, wrapper_bytes=wrapper_bytes
        ) as measurement,
        _optimizer_phases(measurement),
        trial_buckets(buckets, workload.module, spec.device, measurement) as held,  # freed unrecorded
        ExitStack() as recorder,  # closed after ``record_steps`` steps: the recording ends there
    ):
        recording = recorder.enter_context(spec.device.recording()) if spec.record else None
        if started is not None:
            started.append(measurement)
        measurement.recording = recording
        if warm_host is not None and optimizer is not None:
            _make_training_state(spec, optimizer, warm_host)
        workload.module.train(spec.mode == "train")
        if held is not None:
            held.start()
        step_seconds = _each_step(spec, optimizer, host_batch, measurement, recorder, compiled, losses)
    return measurement, step_seconds


def _make_training_state(spec: StepSpec, optimizer: torch.optim.Optimizer, warm_host: Any) -> None:
    """Validation inside training runs with gradients and optimizer state resident: a training
    step on a device copy of ``warm_host`` (a batch of ``spec.warm_batch``) makes them, stepping on
    while overflow skips its optimizer, else no optimizer state is there. Its copy is freed on
    return, before the steps."""
    workload = spec.workload
    workload.module.train()
    warm = to_device(warm_host, spec.device.torch_device)
    step_until_settled(spec.scalers, lambda: workload.run_train_step(optimizer, warm))


def _each_step(
    spec: StepSpec,
    optimizer: torch.optim.Optimizer | None,
    host_batch: Any,
    measurement: Measurement,
    recorder: ExitStack,
    compiled: bool,
    losses: LossLog | None,
) -> float | None:
    """The steps inside the measurement, each begun on it (and on the recording, until
    ``recorder`` closes it), each step's loss kept in ``losses``; the last step's seconds."""
    # A 2-step trial cannot end before its second step, where a recurrence is first seen.
    watch = (
        RecurrenceWatch(needs_optimizer_step=spec.mode == "train")
        if spec.until_steady and spec.steps > 2
        else None
    )
    recording, step_seconds = measurement.recording, None
    scales = [scaler.get_scale() for scaler in spec.scalers]
    step = 0
    while step < spec.steps or _overflow_skipped_every_step(spec, step, measurement, scales):
        step += 1
        if recording is not None and spec.record_steps is not None and step > spec.record_steps:
            recorder.close()  # what it took down stays in measurement.recording
            recording = None
        measurement.begin_step()
        if recording is not None:
            recording.mark_step()
        measurement.steps = step
        if losses is not None:
            losses.step = step
        optimizer_steps = measurement.optimizer_steps
        step_seconds = timed_steps(
            spec.workload,
            optimizer,
            spec.device,
            spec.mode,
            host_batch,
            1,
            compiled=compiled,
            on_loss=None if losses is None else losses.record,
        )
        if watch is not None and step < spec.steps:
            stepped = measurement.optimizer_steps > optimizer_steps
            measurement.steady_from = watch.after_step(spec.device.allocator_state(), stepped)
            if measurement.steady_from is not None:
                break
    return step_seconds


def _overflow_skipped_every_step(
    spec: StepSpec, step: int, measurement: Measurement, scales: list[float]
) -> bool:
    """Whether a train step runs on past ``spec.steps``: its overflowing gradients skipped every
    optimizer step so far, and ``OVERFLOW_STEPS`` more have not run yet."""
    return (
        spec.mode == "train"
        and step < spec.steps + OVERFLOW_STEPS
        and measurement.optimizer_steps == 0
        and scaled_down(spec.scalers, scales)
    )


def step_until_settled(scalers: Sequence[torch.amp.GradScaler], step: Callable[[], object]) -> None:
    """Run ``step`` (a training step) once, and again while a GradScaler's scale comes down, up to
    ``OVERFLOW_STEPS`` more: a fresh scaler's first fp16 steps overflow and skip the optimizer,
    cheaper than training's steps, so a meter warms up past them before it times any."""
    for _ in range(1 + OVERFLOW_STEPS):
        scales = [scaler.get_scale() for scaler in scalers]
        step()
        if not scaled_down(scalers, scales):
            return


def scaled_down(scalers: Sequence[torch.amp.GradScaler], before: list[float]) -> bool:
    """Whether a GradScaler's scale came down: it skipped a step for overflowing gradients."""
    return any(scaler.get_scale() < scale for scaler, scale in zip(scalers, before, strict=True))


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

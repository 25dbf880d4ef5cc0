"""``predict``: the largest train and eval batch on GPUs you do not have, from a few small trials'
allocator requests replayed at each target's memory (``policy.capacity.capacity_prediction``)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from typing_extensions import Unpack

from batchfit.errors import ConfigurationError
from batchfit.options import BatchSizes, Trials, Where, mode_named
from batchfit.policy.allocator.allocation_record import AllocationRecord
from batchfit.policy.capacity.capacity_prediction import CapacityPrediction, CapacityPredictor, Unmodelled
from batchfit.policy.capacity.cards import cublas_workspaces
from batchfit.policy.search.trial import Mode, Trial
from batchfit.prediction.cpu_alone import cuda_defaults, modelled, unmodelled
from batchfit.prediction.prediction import TRACE, TRIALS, Prediction, PredictionRow, Targets
from batchfit.progress import Event, OnProgress, tell
from batchfit.runtime.devices.caching_device import CachingCpuDevice
from batchfit.runtime.devices.cuda import CudaDevice
from batchfit.runtime.devices.device import Device
from batchfit.runtime.devices.resolve import resolve_device
from batchfit.runtime.devices.tracker import resident_tensors
from batchfit.runtime.distributed.buckets import opening_steps
from batchfit.runtime.steps.attention import CudaAttention, cuda_attention
from batchfit.runtime.steps.reach import grad_scalers
from batchfit.runtime.steps.runner import TrialRunner
from batchfit.runtime.steps.state import TrainingSnapshot
from batchfit.runtime.steps.trace import TraceUnavailable, fake_copy, tracing, untraceable
from batchfit.runtime.workloads.entry import check_entry
from batchfit.runtime.workloads.searchable import check_searchable
from batchfit.runtime.workloads.workload import Workload
from batchfit.where import WhereShorthand, where_of

#: The batch sizes recorded: the pair ``find`` opens with and one more, whose own answer shows the
#: replay's error where the step's requests do not follow lines in the batch.
RECORD_SIZES = (2, 4, 8)
#: Where the CPU stands in alone: its capacity for the small trials (their own memory is real).
CPU_RECORDING_BYTES = 1 << 40


def predict(
    workload: Workload,
    targets: Targets,
    *,
    modes: Sequence[str] = ("train", "eval"),
    where: Where | None = None,
    sizes: BatchSizes = BatchSizes(),
    trials: Trials = Trials(),
    on_progress: OnProgress | None = None,
    **shorthand: Unpack[WhereShorthand],
) -> Prediction:
    """Predict the largest ``modes`` batch on GPUs of other sizes: the ``targets``' capacities
    (totals, such as ``Targets(capacities="24GiB,80GiB")``) and cards (``Targets(gpus="T4")``, from
    ``batchfit.policy.capacity.cards.CARDS``), each less its CUDA context and the reserve, at
    ``memory_fraction`` of the rest, as ``find`` would search there.

    On a GPU (``device="cuda"``) small trials (``RECORD_SIZES``) record their requests to the
    caching allocator, replayed on its model at each target. On the CPU (``device="cpu"``) the same
    trials are traced on fake tensors (nothing allocated: a model built on the meta device too), or
    run on the CPU where the step cannot be traced, with CUDA's allocator modelled, what differs on
    CUDA added where it can be (cuBLAS's workspace, a foreach optimizer step) and named and banded
    where it cannot. The model, optimizer and RNG are left as they were. ``where`` says where
    the trials run (a ``batchfit.Where``; ``device``, ``memory_limit`` and ``memory_fraction`` its
    shorthand): a ``memory_limit`` caps the recording device (on the CPU alone, it replaces
    ``CPU_RECORDING_BYTES``). ``on_progress`` hears each recorded trial.
    """
    given = {"targets": (targets, Targets), "sizes": (sizes, BatchSizes), "trials": (trials, Trials)}
    check_entry("predict", workload, on_progress, **given)
    chosen = where_of("predict", where, shorthand)
    named = tuple(mode_named(mode) for mode in modes)
    target = resolve_device(chosen.device, chosen.memory_limit_bytes)
    fraction = chosen.memory_fraction
    if isinstance(target, CudaDevice):
        return predict_on(
            Recorder(target), workload, targets, named, fraction, sizes, trials, on_progress=on_progress
        )
    recording = CachingCpuDevice(chosen.memory_limit_bytes or CPU_RECORDING_BYTES)
    return predict_on(
        Recorder(recording, cpu_alone=True),
        workload,
        targets,
        named,
        fraction,
        sizes,
        trials,
        on_progress=on_progress,
    )


@dataclass(frozen=True)
class Recorder:
    """Where ``predict`` records: CUDA, or the CPU with CUDA's allocator modelled; ``cpu_alone``:
    the CPU stands in for CUDA (its additions and unmodelled parts apply)."""

    device: CachingCpuDevice | CudaDevice
    cpu_alone: bool = False


def predict_on(
    recorder: Recorder,
    workload: Workload,
    targets: Targets,
    modes: Sequence[Mode],
    memory_fraction: float = 0.8,
    sizes: BatchSizes = BatchSizes(),
    trials: Trials = Trials(),
    *,
    on_progress: OnProgress | None = None,
) -> Prediction:
    """``predict`` recording on ``recorder``'s device."""
    device, cpu_alone = recorder.device, recorder.cpu_alone
    started = time.perf_counter()
    memories = targets.memories()
    missing: dict[Unmodelled, None] = {}  # what the CPU alone cannot model: in order, each once
    steps = trials.confirm_steps or device.confirm_steps or trials.steps_per_trial
    rows: dict[str, dict[Mode, CapacityPrediction]] = {memory.name: {} for memory, _ in memories}
    recorded: dict[Mode, tuple[Trial, ...]] = {}
    evidence: dict[Mode, dict[int, AllocationRecord]] = {}
    untraced: dict[Mode, str] = {}
    for mode in modes:
        check_searchable(workload, mode, device, meta=cpu_alone)
        candidates = sizes.candidates(mode)
        records, ran, why, found = _recorded(
            device, workload, mode, memory_fraction, trials, candidates.first, cpu_alone
        )
        for trial in ran:
            tell(on_progress, Event("predict", "trial", mode, trial.batch_size, trial))
        untraced.update({mode: why} if why else {})
        missing.update(dict.fromkeys(found))
        recorded[mode], evidence[mode] = ran, records
        predictors: dict[tuple[int, ...], CapacityPredictor] = {}
        for memory, hopper in memories:
            kept = cublas_workspaces(hopper) if cpu_alone else ()
            if kept not in predictors:
                predictors[kept] = CapacityPredictor(records, steps, device.soft_workspaces, kept)
            rows[memory.name][mode] = predictors[kept].predict(
                memory, candidates, memory_fraction, targets.reserve_bytes, found
            )
    return Prediction(
        device=device.name,
        cpu_alone=cpu_alone,
        memory_fraction=memory_fraction,
        reserve_bytes=targets.reserve_bytes,
        steps=steps,
        rows=tuple(
            PredictionRow.of(memory, rows[memory.name], memory_fraction, targets.reserve_bytes)
            for memory, _ in memories
        ),
        recorded_trials=recorded,
        records=evidence,
        recorded_by={mode: TRIALS if mode in untraced or not cpu_alone else TRACE for mode in modes},
        untraced=untraced,
        unmodelled=tuple(missing),
        modelled=modelled(cpu_alone, workload, tuple(missing)),
        seconds=time.perf_counter() - started,
        recorded_capacity_bytes=None if cpu_alone else _capacity(device, workload),
    )


def _recorded(
    device: Device,
    workload: Workload,
    mode: Mode,
    memory_fraction: float,
    trials: Trials,
    smallest: int,
    cpu_alone: bool,
) -> tuple[dict[int, AllocationRecord], tuple[Trial, ...], str, tuple[Unmodelled, ...]]:
    """One mode's records and trials on ``device``, why they were not traced ("" where they were
    or need not be), and what the CPU alone cannot model of the step."""
    if not cpu_alone:
        return (*record(workload, mode, device, memory_fraction, trials, smallest), "", ())
    attention = CudaAttention()
    with cuda_defaults(workload.optimizer):
        records, ran, why = record_cpu_alone(
            workload, mode, device, memory_fraction, trials, smallest, attention
        )
    return records, ran, why, unmodelled(workload, attention)


def record(
    workload: Workload,
    mode: Mode,
    device: Device,
    memory_fraction: float,
    trials: Trials,
    smallest: int = 1,
) -> tuple[dict[int, AllocationRecord], tuple[Trial, ...]]:
    """The allocator requests of ``RECORD_SIZES`` trials that fit (each of
    ``trials.steps_per_trial`` steps under the device's budget), and the trials; stops at the first
    that does not fit. An eval trial first trains ``trials.warm_batch_size`` (else ``smallest``,
    the smallest candidate), as find's do. The model, optimizer and RNG are put back after."""
    optimizer = workload.optimizer if isinstance(workload.optimizer, torch.optim.Optimizer) else None
    snapshot = TrainingSnapshot.capture(workload.module, optimizer, workload.functions)
    ran: list[Trial] = []
    try:
        snapshot.set_gradients_aside()
        budget = int(memory_fraction * _capacity(device, workload))
        trained_first = mode == "eval" and trials.eval_with_training_state
        warm = (trials.warm_batch_size or smallest) if trained_first else None
        # A step past DDP's rebuild of its buckets, where the trials reproduce it: the replay plays
        # the last recorded step as the steady one.
        steps = opening_steps(trials.steps_per_trial, workload.buckets, device.bucket_holding, mode)
        runner = TrialRunner.on(workload, device, mode, steps, budget, snapshot, warm, record=True)
        for batch_size in RECORD_SIZES:
            trial = runner.run(batch_size)
            ran.append(trial)
            if not trial.fits:
                break
    finally:
        snapshot.restore(gradients=True)
        device.release()
    records = dict(runner.records)  # the runner's, each fitting trial's
    if len(records) < 2:
        raise ConfigurationError(
            f"the {mode} step recorded {len(records)} trial(s) of {list(RECORD_SIZES)} on {device.name} "
            f"({', '.join(trial.line(str(trial.batch_size)) for trial in ran)}): a prediction needs two "
            f"that fit and whose requests align. Lower the batch sizes' memory (a smaller model) or "
            f"use a device with more memory to record on."
        )
    return records, tuple(ran)


def record_cpu_alone(
    workload: Workload,
    mode: Mode,
    device: Device,
    memory_fraction: float,
    trials: Trials,
    smallest: int = 1,
    attention: CudaAttention | None = None,
) -> tuple[dict[int, AllocationRecord], tuple[Trial, ...], str]:
    """The CPU alone's records: of a fake-tensor trace of the trials (``record_traced``, its
    attention by ``attention``) where the step can be traced, else of the real trials on ``device``;
    and why not traced ("" where it was)."""
    try:
        return (*record_traced(workload, mode, memory_fraction, trials, smallest, attention), "")
    except TraceUnavailable as error:
        why = str(error)
    held = [*workload.module.named_parameters(), *workload.module.named_buffers()]
    meta = [name for name, tensor in held if tensor.is_meta]
    if meta:
        raise ConfigurationError(
            f"the {mode} step cannot run on fake tensors ({why}), and the model's {meta[0]} is on the "
            f"meta device, where no real trial runs: build the model on the CPU, or make its step "
            f"traceable (no .item() or data-dependent shapes)."
        )
    records, ran = record(workload, mode, device, memory_fraction, trials, smallest)
    return records, ran, why


def record_traced(
    workload: Workload,
    mode: Mode,
    memory_fraction: float,
    trials: Trials,
    smallest: int = 1,
    attention: CudaAttention | None = None,
) -> tuple[dict[int, AllocationRecord], tuple[Trial, ...]]:
    """``record``'s trials run on a fake copy of the model and optimizer (``FakeTensorMode``), CUDA's
    allocator modelled on the fake tensors' storages: the requests the real trials on the CPU
    make, with nothing allocated (a model on the meta device too), but for attention, which
    allocates as CUDA's fused kernel does (``attention``, which counts the calls). The trials carry
    no step times. ``TraceUnavailable`` where the step cannot be traced (it reads a value, say)."""
    skipped = untraceable(workload)
    if skipped:
        raise TraceUnavailable(skipped)
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    scalers = grad_scalers(workload.train_step, workload.eval_step)
    with tracing(fake_mode, scalers), cuda_attention(attention or CudaAttention(), workload.module):
        device = CachingCpuDevice(CPU_RECORDING_BYTES, fake=True)
        records, ran = record(fake_copy(workload, fake_mode), mode, device, memory_fraction, trials, smallest)
    return records, tuple(replace(trial, step_seconds=None) for trial in ran)


def _capacity(device: Device, workload: Workload) -> int:
    """What ``device`` holds for ``workload``'s trials, its resident tensors aside."""
    held = resident_tensors(workload.module, workload.optimizer, *workload.reached)
    return device.capacity_bytes(held, workload.wrapper_bytes)

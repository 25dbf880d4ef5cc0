"""The trial every method in ``bench/find.py`` runs: the case's one workload put back to its freshly
built state, ``STEPS_PER_TRIAL`` training steps under a memory cap; and what a method's search
returns."""

from __future__ import annotations

import copy
import gc
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import _workloads
import torch

import batchfit
from batchfit.runtime.devices.allocator_settings import expandable_segments
from batchfit.runtime.devices.caching_device import CachingCpuDevice
from batchfit.runtime.devices.device import Device
from batchfit.runtime.devices.measurement import Measurement
from batchfit.runtime.devices.oom import is_out_of_memory
from batchfit.runtime.devices.resolve import parse_device, resolve_device
from batchfit.runtime.devices.tracker import resident_tensors
from batchfit.runtime.steps.reach import grad_scalers
from batchfit.runtime.workloads.batches import to_device
from batchfit.runtime.workloads.workload import Workload
from batchfit.search.find_batch_size import find_on
from batchfit.where import ResolvedDevice

STEPS_PER_TRIAL = 2
#: The benchmark's name for the CPU with CUDA's caching allocator modelled on its real allocations.
CPU_CACHING = "cpu-caching"
#: The upper bound of every search: batchfit's default max_batch_size for training, and the batch
#: size accelerate starts from.
MAX_BATCH_SIZE = 512


@dataclass(frozen=True)
class Case:
    """A workload under a cap. ``cap`` is a size, or ``ref:B``: the memory a trial at batch ``B``
    reserved (CUDA), so that the built-in examples get answers near ``B`` on any GPU."""

    workload: str
    cap: str
    precision: str = "32-true"  # Lightning's precision: "16-mixed" where the step uses AMP
    cudnn_benchmark: bool = False

    @property
    def name(self) -> str:
        return self.workload + (" (cudnn.benchmark)" if self.cudnn_benchmark else "")


@dataclass
class MethodResult:
    """One method's search: its answer, the batch sizes it ran in order, and its wall time."""

    answer: int | None
    sizes: list[int]
    seconds: float  # wall-clock (perf_counter); with --repeat, the median of the runs
    cpu_seconds: float  # this process's CPU time (all threads), less disturbed by other processes
    peaks: dict[int, int] = field(default_factory=dict)  # batch size -> peak bytes of a fitting trial
    error: str = ""
    all_seconds: list[float] = field(default_factory=list)  # every run's wall-clock seconds
    traces: int = 0  # batchfit only: fake-tensor traces (predictions, no memory allocated)
    trains: bool | None = None  # the answer trains find.py's CONFIRM_STEPS steps under the cap

    @property
    def trials(self) -> int:
        return len(self.sizes)


def bench_device(name: str) -> tuple[torch.device, str]:
    """``--device``'s torch device and its kind of cases: ``cpu``, ``cuda``, or ``cpu-caching``
    (the CPU, each capped block behind a fresh modelled caching allocator: its cache empty)."""
    if name == CPU_CACHING:
        return torch.device("cpu"), CPU_CACHING
    device = parse_device(name)
    return device, device.type


class Bench:
    """One case on one device: its workload, put back as built for each method, and the capped
    trial they all run."""

    def __init__(
        self,
        case: Case,
        device: torch.device,
        cap_bytes: int = 0,
        kind: str | None = None,
        build: Callable[[torch.device], Workload] | None = None,
    ) -> None:
        """``build``: how the case's workload is made (default: ``_workloads.build`` by its name)."""
        self.case, self.device, self.cap_bytes = case, device, cap_bytes
        self.kind = kind or device.type
        self.build = build or (lambda device: _workloads.build(case.workload, device))
        self._built: tuple[Workload, FreshState] | None = None

    def target(self, limit: int) -> Device:
        """The batchfit device every method's trials run on, capped at ``limit``."""
        if self.kind == CPU_CACHING:  # as CUDA's is set: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
            return CachingCpuDevice(limit, expandable_segments())
        return resolve_device(self.device, limit)

    def workload(self) -> tuple[Workload, FreshState]:
        """The case's workload for a method (the reference cap, a search, a confirming run, the
        truth), put back as built: weights, no gradients, no optimizer state, its GradScalers
        unstepped, nothing cached.

        One model for the case, built once, not one per method: every method trains the same
        model in the same place. Where the allocator maps pages into one segment
        (``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``), a model built anew sits elsewhere
        in it, and the pages its weights share with a step's blocks move with it: on an H200 with
        a model per method, the methods disagreed on one batch (the cnn's 138 fitted in
        batchfit's trials and 134 failed in the truth's; the mlp's 256 fitted and 1 failed), while
        a search and its truth on one model agreed (the GPU tests)."""
        torch.backends.cudnn.benchmark = self.case.cudnn_benchmark
        if self._built is None:
            workload = self.build(self.device)
            self._built = workload, FreshState(workload)
        workload, state = self._built
        state.restart()
        return workload, state

    def live_bytes(self) -> int | None:
        """The bytes of tensors alive on the GPU after a collection (None off CUDA): between two
        methods, the model and what the process keeps (cuBLAS's workspaces, from the first matmul
        on); growth beyond that is a method's leftovers, which shrink the room of every method after
        it (the truth and the 20-step checks run last)."""
        if self.device.type != "cuda":
            return None
        self.workload()  # built (once), and put back as built: no gradients, no optimizer state
        gc.collect()
        torch.cuda.synchronize(self.device)
        return int(torch.cuda.memory_allocated(self.device))

    def train_steps(
        self, workload: Workload, optimizer: torch.optim.Optimizer, host: Any, steps: int
    ) -> None:
        """The trial every method runs: ``steps`` steps, each on a fresh copy of the batch."""
        for _ in range(steps):
            workload.run_train_step(optimizer, to_device(host, self.device))
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def capped(self, state: FreshState, cap_bytes: int | None = None) -> AbstractContextManager[Measurement]:
        """A block under the case's cap (or ``cap_bytes``), as ``batchfit.cap_memory`` makes it."""
        cap = self.cap_bytes if cap_bytes is None else cap_bytes
        return self.target(cap).measure(resident_tensors(state.model, state.optimizer), cap)

    def trial(self, workload: Workload, state: FreshState, batch_size: int, steps: int) -> int | None:
        """Run one trial under the cap from the fresh state; its peak bytes, or None if it ran out."""
        state.reset()
        host = workload.host_batch(batch_size)  # outside the cap, like batchfit's data
        try:
            with self.capped(state) as measurement:
                self.train_steps(workload, state.optimizer, host, steps)
        except Exception as error:
            if not is_out_of_memory(error):
                raise
            del error
            state.reset()
            return None
        return measurement.peak_bytes

    def probe(self, batch_size: int, steps: int) -> bool:
        """A probe of the truth: whether ``steps`` steps of ``batch_size`` complete under the cap,
        from the case's model as built (weights, no gradients or optimizer state, its GradScalers
        unstepped) with the allocator's cache emptied."""
        workload, state = self.workload()
        return self.trial(workload, state, batch_size, steps) is not None

    def find(self, workload: Workload) -> batchfit.SearchResult:
        """``find_batch_size`` as every benchmark runs it: train, under the cap at fraction 1."""
        return find_on(
            ResolvedDevice(self.target(self.cap_bytes), 1.0),
            workload,
            "train",
            batchfit.BatchSizes(max_batch_size=MAX_BATCH_SIZE),
            batchfit.Trials(steps_per_trial=STEPS_PER_TRIAL),
        )

    def reserved_at(self, batch_size: int) -> int:
        """What a trial at ``batch_size`` reserved, uncapped: a cap near what it needs."""
        workload, state = self.workload()
        host = workload.host_batch(batch_size)
        with self.capped(state, 2**50) as measurement:
            self.train_steps(workload, state.optimizer, host, STEPS_PER_TRIAL)
        return int(measurement.reserved_peak_bytes or measurement.peak_bytes)

    def warm_up(self) -> None:
        """One uncapped, untimed trial so no method pays for first-call setup (on CUDA: the context,
        library handles and cuBLAS's workspace, which stays allocated for every method alike)."""
        workload, state = self.workload()
        self.train_steps(workload, state.optimizer, workload.host_batch(4), STEPS_PER_TRIAL)
        state.reset()


class FreshState:
    """Puts a workload's model and optimizer back as built: initial weights, no gradients, no
    optimizer state (so it is created on the first step of each trial, for every method alike),
    and nothing left in the allocator's cache."""

    def __init__(self, workload: Workload) -> None:
        if not isinstance(workload.optimizer, torch.optim.Optimizer):
            raise TypeError("the benchmark's workloads hold an Optimizer instance")
        self.model = workload.model
        self.optimizer: torch.optim.Optimizer = workload.optimizer
        # The initial weights wait on the host: on CUDA the cap counts every tensor of the process,
        # and a copy on the GPU would take its bytes from each method's trials (ResNet-50's 100 MB
        # is more than a sample at the boundary).
        self.weights = {name: value.to("cpu", copy=True) for name, value in self.model.state_dict().items()}
        self.cuda = any(parameter.is_cuda for parameter in self.model.parameters())
        # A mixed-precision step's scalers as built (unstepped: no scale yet), for each method to
        # start from; within a method their scale carries from trial to trial, as in training.
        scalers = grad_scalers(workload.train_step, workload.eval_step)
        self.scalers = [(scaler, copy.deepcopy(vars(scaler))) for scaler in scalers]

    def restart(self) -> None:
        """Everything as built, the GradScalers too: where a method starts."""
        for scaler, built in self.scalers:
            vars(scaler).clear()
            vars(scaler).update(copy.deepcopy(built))
        self.reset()

    def reset(self) -> None:
        self.model.load_state_dict(self.weights)
        for parameter in self.model.parameters():
            parameter.grad = None
        self.optimizer.state.clear()
        self.model.train()
        if self.cuda:  # what batchfit's CUDA trials do first too (on the CPU nothing is cached)
            gc.collect()
            torch.cuda.empty_cache()

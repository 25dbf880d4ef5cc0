"""Devices a search runs on: one interface; the CPU and the capped CPU here, the caching-allocator
devices (CUDA, and the CPU with CUDA's allocator modelled) in ``caching_device`` and ``cuda``.

A device knows its capacity in bytes, runs a block of work under a hard cap and measures its
peaks. The CPU devices count live tensor storages with ``StorageTracker``, which also enforces
the cap; CUDA caps its caching allocator and reads the allocator's statistics.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Hashable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Protocol

import torch

from batchfit.policy.allocation_record import Recording
from batchfit.runtime.devices.host import data_limited, host_available_bytes, malloc_trim
from batchfit.runtime.devices.tracker import StorageTracker, resident_oom_message
from batchfit.runtime.steps.compiled import ProfiledAllocations, ProfiledSteps
from batchfit.units import format_bytes


class Probe(Protocol):
    """Where a device reads its memory peaks since the last reset: allocated and, for a device with
    a caching allocator, reserved bytes (None where nothing is cached)."""

    def peaks(self) -> tuple[int, int | None]: ...

    def reset(self) -> None: ...

    def refused(self) -> str:
        """The message of the last allocation batchfit's own cap refused in the block ("" where none
        did, or where the device's allocator enforces the cap itself, as CUDA's does)."""
        ...


@dataclass
class Measurement:
    """What a device saw during one trial, kept for its last (steady-state) step.

    ``begin_step`` starts a step: the first step of a trial is not its steady state (it creates
    the optimizer state, autotunes kernels, initialises libraries lazily), so only the last step's
    peaks are kept. Within a step the peak inside ``optimizer.step`` (``optimizer_peak_bytes``)
    and the peak outside it (``activation_peak_bytes``) are kept apart: the first hardly grows
    with the batch, the second does, and the memory model fits them apart.
    """

    peak_bytes: int = 0  # allocated: the larger of the two phases' peaks
    reserved_peak_bytes: int | None = None  # what the caching allocator held at most (CUDA)
    allocator_retries: int = 0  # over the whole trial
    optimizer_peak_bytes: int | None = None
    activation_peak_bytes: int | None = None
    steps: int = 0  # the steps run (to the one that failed)
    optimizer_steps: int = 0  # the optimizer steps completed, over the whole trial
    steady_from: int | None = None  # the step whose end state the last step's recurred
    recording: Recording | None = None  # the allocator's requests and frees, where recorded
    # An allocation batchfit's cap refused (the CPU devices): the trial's failure even where the
    # error that reached it lost that message (TorchScript's interpreter re-raises it empty).
    refused: str = ""
    _probe: Probe | None = None

    def begin_step(self) -> None:
        if self._probe is not None:
            self._probe.reset()
        self.optimizer_peak_bytes = self.activation_peak_bytes = self.reserved_peak_bytes = None

    def enter_optimizer_step(self) -> None:
        self.activation_peak_bytes = self._close_phase(self.activation_peak_bytes)

    def exit_optimizer_step(self) -> None:
        self.optimizer_peak_bytes = self._close_phase(self.optimizer_peak_bytes)
        self.optimizer_steps += 1

    def finish(self) -> None:
        """Close the last phase (outside any optimizer step) and stop reading the device."""
        self.enter_optimizer_step()
        self.peak_bytes = max(self.activation_peak_bytes or 0, self.optimizer_peak_bytes or 0)
        if self._probe is not None:
            self.refused = self._probe.refused()
        self._probe = None

    def _close_phase(self, so_far: int | None) -> int | None:
        if self._probe is None:
            return so_far
        allocated, reserved = self._probe.peaks()
        self._probe.reset()
        if reserved is not None:
            self.reserved_peak_bytes = max(self.reserved_peak_bytes or 0, reserved)
        return max(so_far or 0, allocated)


class Device(Protocol):
    """The memory interface a search needs from a device.

    A trial runs inside ``measure(resident, cap_bytes)``: the device's memory is hard-capped at
    ``cap_bytes`` for the block, so a batch that does not fit fails at its real allocation, as it
    would in training on a device of that size; the cap is lifted when the block exits, however
    it exits. ``release`` gives back what earlier work left cached, so each trial starts from the
    workload's resident state.
    """

    name: str
    torch_device: torch.device
    #: A failed trial leaves nothing behind once ``release`` has run, so an answer found after a
    #: failure fits as well in the state training starts from (no second look needed).
    exact: bool
    #: Steps the answer is run again for before it is final, where the allocator's state builds
    #: over the first steps (a caching allocator fragments); None where the trial's steps decide.
    confirm_steps: int | None
    #: A workspace the allocator cannot place is done without (the kernel runs an algorithm that
    #: needs less, as cuDNN's do), not an out-of-memory of the step: the allocation replay's rule.
    soft_workspaces: bool
    #: Whether a step that runs ``torch.compile``'d code is measured as it runs (compiled), not as
    #: its eager twin: the allocator a dispatch mode models cannot see inside compiled code.
    measures_compiled: bool
    #: The fewest steps in one of explore's timing windows: where a window starts from an idle,
    #: synchronised device, its first step pays a ramp that back-to-back training steps hide.
    min_window_steps: int

    def capacity_bytes(self, resident: Iterable[torch.Tensor], wrapper_bytes: int = 0) -> int:
        """Bytes the workload may use in all, counting the ``resident`` tensors it already holds
        and the ``wrapper_bytes`` its model's wrapper holds beside them (``Workload.wrapper_bytes``)."""
        ...

    def measure(
        self,
        resident: Iterable[torch.Tensor],
        cap_bytes: int | None = None,
        *,
        compiled: bool = False,
        wrapper_bytes: int = 0,
    ) -> AbstractContextManager[Measurement]:
        """A block under a hard cap (none when None), yielding a ``Measurement`` filled in at exit;
        ``compiled``: the block runs ``torch.compile``'d code (``runtime.steps.compiled``);
        ``wrapper_bytes``: what the model's wrapper holds beside the ``resident`` tensors
        (``Workload.wrapper_bytes``), counted where the device does not see it already."""
        ...

    def synchronize(self) -> None: ...

    def recording(self) -> AbstractContextManager[Recording | None]:
        """Inside ``measure``: a block whose requests to the allocator are taken down, step by step
        (``policy.allocation_replay``); None where no allocator places them (memory counted as
        live bytes, or an allocator that cannot be recorded)."""
        ...

    def release(self) -> None:
        """Give back what earlier trials left cached (after a failure above all)."""
        ...

    def allocator_state(self) -> Hashable | None:
        """What decides where the allocator places the next requests (``policy.steady``), inside
        ``measure``; None where nothing does (memory counted as live bytes)."""
        ...


class CpuDevice:
    """The host CPU; capacity is what the process can really use (RAM, cgroup, RLIMIT_AS).

    The cap is enforced by a ``StorageTracker`` on the live tensor storages, to the byte.
    """

    name = "cpu"
    torch_device = torch.device("cpu")
    exact = False  # a real allocator failure (RLIMIT_AS) can leave the heap larger than it was
    confirm_steps: int | None = None  # the tracker counts live bytes: step 2 is every later step
    soft_workspaces = False  # nothing is replayed: live bytes decide
    measures_compiled = True  # from the allocator's events, read by the profiler (runtime.steps.compiled)
    min_window_steps = 1  # nothing runs ahead of the host: a step is a step

    def __init__(self, *, fake: bool = False) -> None:
        self.fake = fake  # measure fake tensors: a trace, not a run

    def capacity_bytes(self, resident: Iterable[torch.Tensor], wrapper_bytes: int = 0) -> int:
        held = sum(tensor.untyped_storage().nbytes() for tensor in unique_storages(resident))
        return host_available_bytes() + held + wrapper_bytes

    @contextmanager
    def measure(
        self,
        resident: Iterable[torch.Tensor],
        cap_bytes: int | None = None,
        *,
        compiled: bool = False,
        wrapper_bytes: int = 0,
    ) -> Iterator[Measurement]:
        if compiled and not self.fake:  # Dynamo runs a step eagerly under the tracker's dispatch mode
            with _profiled(resident, cap_bytes, wrapper_bytes) as measurement:
                yield measurement
            return
        tracker = StorageTracker(capacity_bytes=cap_bytes, fake=self.fake)
        tracker.track(unique_storages(resident))
        tracker.hold(wrapper_bytes)  # allocated where no tensor shows them: counted, as on a GPU
        del resident  # counted: a tensor the steps replace (L-BFGS's history) must be free to go
        if cap_bytes is not None and tracker.live_bytes > cap_bytes:
            raise torch.OutOfMemoryError(resident_oom_message(tracker.live_bytes, cap_bytes))
        measurement = Measurement(_probe=_TrackerProbe(tracker))
        try:
            with tracker:
                yield measurement
        finally:
            measurement.finish()

    def synchronize(self) -> None:
        pass

    def allocator_state(self) -> Hashable | None:
        return None  # live bytes decide: a trial's second step is every later step (confirm_steps)

    def recording(self) -> AbstractContextManager[Recording | None]:
        return nullcontext(None)  # live bytes decide: nothing is placed, so nothing to replay

    def release(self) -> None:
        # A trial's garbage is young: collecting the two younger generations frees its cycles
        # (an exception's traceback and the frames it holds) without walking all of torch.
        gc.collect(1)
        malloc_trim()


@dataclass
class _ProfiledMeasurement(Measurement):
    """A measurement whose peaks are read from the allocator's events after the block: each call
    that would read the device drops a marker into the events instead (``ProfiledAllocations``)."""

    _allocations: ProfiledAllocations | None = None

    def begin_step(self) -> None:
        if self._allocations is not None:
            self._allocations.mark("step")

    def enter_optimizer_step(self) -> None:
        if self._allocations is not None:
            self._allocations.mark("enter")

    def exit_optimizer_step(self) -> None:
        if self._allocations is not None:
            self._allocations.mark("exit")
        self.optimizer_steps += 1

    def finish(self) -> None:
        self._allocations = None

    def read(self, steps: ProfiledSteps) -> None:
        """The last step's peaks, as the events give them (up to a refused allocation)."""
        steps.close_phase()
        self.activation_peak_bytes = steps.activation_peak_bytes
        self.optimizer_peak_bytes = steps.optimizer_peak_bytes
        self.peak_bytes = max(self.activation_peak_bytes or 0, self.optimizer_peak_bytes or 0)
        self.refused = steps.refused
        if steps.refused:
            self.steps = steps.step  # the step that ran out; the rest ran, as the profiler cannot stop one


@contextmanager
def _profiled(
    resident: Iterable[torch.Tensor], cap_bytes: int | None, wrapper_bytes: int
) -> Iterator[Measurement]:
    """``CpuDevice.measure`` for a step that runs compiled code: the allocator's events, read by
    the profiler, under a cap judged on them once the block has run (``runtime.steps.compiled``)."""
    allocations = ProfiledAllocations(resident, cap_bytes, wrapper_bytes)
    del resident
    if cap_bytes is not None and allocations.resident_bytes > cap_bytes:
        raise torch.OutOfMemoryError(resident_oom_message(allocations.resident_bytes, cap_bytes))
    measurement = _ProfiledMeasurement(_allocations=allocations)
    failed = False
    try:
        # The cap is judged after the steps, so a batch far past it would take the host's memory
        # meanwhile: past what the host has free, the allocator fails instead of the kernel
        # killing the process (a false failure below the cap would need that much more for glibc).
        with data_limited(host_available_bytes()), allocations:
            yield measurement
    except BaseException:
        failed = True
        raise
    finally:
        measurement.finish()
        measurement.read(allocations.steps())
    if measurement.refused and not failed:  # where the step would have failed under the cap
        raise torch.OutOfMemoryError(measurement.refused)


class CappedCpuDevice(CpuDevice):
    """The CPU with a fixed capacity, ``limit_bytes``: it stands in for a GPU of that size."""

    exact = True

    def __init__(self, limit_bytes: int) -> None:
        super().__init__()
        self.limit_bytes = limit_bytes
        self.name = f"cpu (capped at {format_bytes(limit_bytes)})"

    def capacity_bytes(self, resident: Iterable[torch.Tensor], wrapper_bytes: int = 0) -> int:
        return self.limit_bytes


class GarbageCollector:
    """Frees the tensors that earlier trials left in reference cycles (a failed step's traceback
    holds its frames, and they their activations), without walking the whole heap each time.

    A trial's garbage is young, so the two younger generations are collected first: under a
    millisecond, where a full collection took 0.09 s with torch imported and 0.2 s with Lightning
    and accelerate too (docs/benchmarks.md). The whole heap is collected only when the device
    still holds more than it did after the last collection (garbage that outlived a young
    collection, or the caller's before the first). ``held_bytes`` reads what the device holds
    (CUDA: the allocated bytes).
    """

    def __init__(self, held_bytes: Callable[[], int]) -> None:
        self.held_bytes = held_bytes
        self.settled: int | None = None  # what the device held after the last collection
        self.full_collections = 0

    def collect(self) -> None:
        gc.collect(1)
        held = self.held_bytes()
        if self.settled is None or held > self.settled:
            gc.collect()
            self.full_collections += 1
            held = self.held_bytes()
        self.settled = held


class _TrackerProbe:
    def __init__(self, tracker: StorageTracker) -> None:
        self.tracker = tracker

    def peaks(self) -> tuple[int, int | None]:
        return self.tracker.peak_bytes, None  # storages are allocated as they are counted

    def reset(self) -> None:
        self.tracker.reset_peak()

    def refused(self) -> str:
        return self.tracker.refused


def unique_storages(tensors: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    seen: dict[int, torch.Tensor] = {}
    for tensor in tensors:
        seen.setdefault(tensor.untyped_storage()._cdata, tensor)
    return list(seen.values())

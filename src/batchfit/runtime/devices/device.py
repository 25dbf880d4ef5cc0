"""Devices a search runs on: one interface; the CPU and the capped CPU here, the caching-allocator
devices (CUDA, and the CPU with CUDA's allocator modelled) in ``caching_device`` and ``cuda``.

A device knows its capacity in bytes, runs a block of work under a hard cap and measures its
peaks. The CPU devices count live tensor storages with ``StorageTracker``, which also enforces
the cap; CUDA caps its caching allocator and reads the allocator's statistics.
"""

from __future__ import annotations

import gc
from collections.abc import Hashable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Literal, Protocol

import torch

from batchfit.policy.allocator.allocation_record import Recording
from batchfit.runtime.devices.host import data_limited, host_available_bytes, malloc_trim
from batchfit.runtime.devices.measurement import Measurement, profiled
from batchfit.runtime.devices.tracker import StorageTracker, resident_oom_message
from batchfit.units import format_bytes

#: How a device's training trials hold a ``DistributedDataParallel``'s gradient buckets
#: (``runtime.distributed.buckets``). "counted": as bytes (``Workload.wrapper_bytes``), which the
#: reducer's rebuild, freeing what it allocates, leaves as they were; "placed": as tensors of the
#: trial's own, placed by the allocator and rebuilt in the step DDP rebuilds them; "beside": the
#: allocator holds the DDP's own buckets, which a trial cannot free, so the rebuilt ones are
#: placed beside them (the old ones' bytes counted twice from the rebuild on: the answer errs low).
BucketHolding = Literal["counted", "placed", "beside"]


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
    #: The device measures fake tensors (a trace of the step, which allocates nothing and whose
    #: values cannot be read), not real ones.
    fake: bool
    #: How its training trials hold a DDP's gradient buckets (``BucketHolding``).
    bucket_holding: BucketHolding
    #: Its memory is the host's own (the CPU with no ``memory_limit``): the host's allocator
    #: failing is this device running out. Elsewhere it is the machine running out, not the
    #: budget (``runtime.devices.host_failure``).
    host_is_capacity: bool

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
        (``policy.allocator.allocation_replay``); None where no allocator places them (memory counted as
        live bytes, or an allocator that cannot be recorded)."""
        ...

    def release(self) -> None:
        """Give back what earlier trials left cached (after a failure above all)."""
        ...

    def allocator_state(self) -> Hashable | None:
        """What decides where the allocator places the next requests (``policy.allocator.steady``), inside
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
    bucket_holding: BucketHolding = "counted"  # live bytes decide: where a bucket lands does not
    host_is_capacity = True  # the host's memory, as much as it can give

    def __init__(self, *, fake: bool = False, views_of_existing_free: bool = False) -> None:
        self.fake = fake  # measure fake tensors: a trace, not a run
        # A view of a storage alive when the block begins costs nothing (``batchfit.cap_memory``:
        # noting them walks every object, once per block, too slow for a search's trials).
        self.views_of_existing_free = views_of_existing_free

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
            with profiled(resident, cap_bytes, wrapper_bytes) as measurement:
                yield measurement
            return
        tracker = StorageTracker(capacity_bytes=cap_bytes, fake=self.fake)
        tracker.track(unique_storages(resident))
        if self.views_of_existing_free:
            tracker.note_existing()
        tracker.hold(wrapper_bytes)  # allocated where no tensor shows them: counted, as on a GPU
        del resident  # counted: a tensor the steps replace (L-BFGS's history) must be free to go
        if cap_bytes is not None and tracker.live_bytes > cap_bytes:
            raise torch.OutOfMemoryError(resident_oom_message(tracker.live_bytes, cap_bytes))
        measurement = Measurement(_probe=_TrackerProbe(tracker))
        # Past what the host has free (its RAM, its cgroup's room, RLIMIT_AS's), an allocation
        # fails in the host's allocator, which a search can tell from the cap's refusal, instead
        # of the kernel killing the process (a cgroup's limit); a trace allocates nothing.
        room = 0 if self.fake else host_available_bytes()
        try:
            with data_limited(room), tracker:
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


class CappedCpuDevice(CpuDevice):
    """The CPU with a fixed capacity, ``limit_bytes``: it stands in for a GPU of that size."""

    exact = True
    host_is_capacity = False  # a device of limit_bytes, which the host must be able to give

    def __init__(self, limit_bytes: int) -> None:
        super().__init__()
        self.limit_bytes = limit_bytes
        self.name = f"cpu (capped at {format_bytes(limit_bytes)})"

    def capacity_bytes(self, resident: Iterable[torch.Tensor], wrapper_bytes: int = 0) -> int:
        return self.limit_bytes


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

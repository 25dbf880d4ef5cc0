"""Devices whose memory is a caching allocator: one ``measure`` and ``release`` for CUDA and for the CPU
standing in for a GPU with CUDA's caching allocator modelled on the model's real allocations.

The device's logic (the cap on what the allocator reserves, the cache emptied between trials, the
steady-state allocated and reserved peaks, the retries as evidence, the confirming steps) is written
once here, against an ``Allocator`` seam: ``runtime.devices.cuda`` reads and caps torch's own allocator,
``ModelledAllocator`` feeds every storage the CPU allocates to ``policy.allocator.caching_allocator``. So the
CUDA path's logic runs in CI, fragmentation included.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Hashable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Protocol

import torch

from batchfit.policy.allocator.allocation_record import Recording
from batchfit.runtime.devices.device import BucketHolding
from batchfit.runtime.devices.measurement import Measurement
from batchfit.runtime.devices.modelled_allocator import ModelledAllocator
from batchfit.units import format_bytes

#: Steps the answer trains before it is final on a caching allocator: under the cap its
#: fragmentation builds over the first steps, so a batch that trains 2 steps can fail within 10;
#: 10 is the truth's probe.
CONFIRM_STEPS = 10
#: The same with expandable segments, whose mapped pages settle over more steps (how many:
#: docs/search.md, "With expandable segments"). A confirming trial stops where the allocator's
#: state recurs, so the steps past that cost nothing.
EXPANDABLE_CONFIRM_STEPS = 40


class Allocator(Protocol):
    """What a caching device needs of its allocator; also the measurement's ``Probe``."""

    def capped(
        self, resident: Iterable[torch.Tensor], cap_bytes: int | None, wrapper_bytes: int
    ) -> AbstractContextManager[None]:
        """A block in which what the allocator reserves is capped at ``cap_bytes`` (None: no cap),
        the limit in force before put back however the block ends; ``resident`` tensors and
        ``wrapper_bytes`` (``Workload.wrapper_bytes``) are held in it."""
        ...

    def peaks(self) -> tuple[int, int | None]: ...

    def reset(self) -> None: ...

    def refused(self) -> str: ...

    def retries(self) -> int: ...

    def allocated_bytes(self) -> int: ...

    def empty_cache(self) -> None: ...

    def synchronize(self) -> None: ...

    def layout(self) -> Hashable:
        """Every segment's blocks (their sizes and states) in address order, the addresses left
        out: equal layouts place every later request alike."""
        ...

    def recording(self) -> AbstractContextManager[Recording | None]:
        """A block whose requests and frees are taken down from the allocator's state at its start
        (None where this allocator cannot be recorded)."""
        ...


class CachingDevice:
    """A device behind a caching allocator. A trial is what training does under a hard cap: the
    allocator frees its cache and retries before it fails, so the verdict is whether the steps
    complete; the measurements are its allocated and reserved peaks and its retries."""

    exact = True  # release() empties the cache: a failed trial leaves nothing behind
    host_is_capacity = False  # a GPU's memory, or a CPU's standing in for one of limit_bytes
    confirm_steps: int | None = CONFIRM_STEPS
    soft_workspaces = False  # the CPU's kernels take no workspace from the allocator
    # The modelled allocator sees the storages a dispatch mode sees, and Dynamo runs a step eagerly
    # under one; CUDA's own allocator serves compiled code as any other.
    measures_compiled = False
    fake = False  # real tensors: a run, not a trace
    name: str
    torch_device: torch.device
    bucket_holding: BucketHolding

    def __init__(self, allocator: Allocator) -> None:
        self.allocator = allocator
        self.garbage = GarbageCollector(allocator.allocated_bytes)

    @contextmanager
    def measure(
        self,
        resident: Iterable[torch.Tensor],
        cap_bytes: int | None = None,
        *,
        compiled: bool = False,
        wrapper_bytes: int = 0,
    ) -> Iterator[Measurement]:
        del compiled  # the allocator sees compiled code's requests (CUDA), or cannot (measures_compiled)
        self.synchronize()
        if cap_bytes is not None:
            # The cap is checked only when the allocator asks for a new segment: blocks it already
            # caches would let the block use more than the cap (a batch that needs more than the
            # cap would run under it on segments an uncapped step before had left cached).
            self.allocator.empty_cache()
        with self.allocator.capped(resident, cap_bytes, wrapper_bytes):
            del resident  # held by the allocator; a tensor the steps replace must be free to go
            retries_before = self.allocator.retries()
            measurement = Measurement(_probe=self.allocator)
            measurement.begin_step()
            try:
                yield measurement
            finally:
                try:
                    self.synchronize()  # the last kernels' allocations are in the statistics
                finally:
                    measurement.finish()
                    measurement.allocator_retries = self.allocator.retries() - retries_before

    def synchronize(self) -> None:
        self.allocator.synchronize()

    def allocator_state(self) -> Hashable:
        # The retries count with the layout: a retry gives segments back to the driver and the new
        # ones come back at addresses the layout does not name, so no state across one repeats.
        return self.allocator.retries(), self.allocator.layout()

    def recording(self) -> AbstractContextManager[Recording | None]:
        return self.allocator.recording()

    def release(self) -> None:
        self.garbage.collect()  # the whole heap only when the device still holds what a trial left
        self.allocator.empty_cache()


class GarbageCollector:
    """Frees the tensors that earlier trials left in reference cycles (a failed step's traceback
    holds its frames, and they their activations), without walking the whole heap each time.

    A trial's garbage is young, so the two younger generations are collected first: far cheaper
    than a full collection, which walks every object the process holds (torch's, and Lightning's
    or accelerate's where imported). The whole heap is collected only when the device still holds
    more than it did after the last collection (garbage that outlived a young collection, or the
    caller's before the first). ``held_bytes`` reads what the device holds (CUDA: the allocated
    bytes).
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


class CachingCpuDevice(CachingDevice):
    """The CPU standing in for a GPU of ``limit_bytes`` with CUDA's caching allocator (with
    ``expandable_segments``, as ``expandable_segments:True`` sets it): every tensor the step
    allocates is placed by the modelled allocator, so segments, fragmentation, reserved memory and
    retries behave as the allocator's rules make them (not a GPU's own kernels: cuDNN's and
    cuBLAS's workspaces are not in the CPU's allocations). ``fake``: the allocator places the
    storages of fake tensors (a trace of the step under ``FakeTensorMode``), not real ones."""

    torch_device = torch.device("cpu")
    min_window_steps = 1  # nothing runs ahead of the host: a step is a step
    bucket_holding: BucketHolding = "placed"  # the modelled allocator sees what the trial allocates

    def __init__(self, limit_bytes: int, expandable_segments: bool = False, *, fake: bool = False) -> None:
        super().__init__(ModelledAllocator(expandable_segments, fake))
        self.limit_bytes, self.fake = limit_bytes, fake
        self.confirm_steps = EXPANDABLE_CONFIRM_STEPS if expandable_segments else CONFIRM_STEPS
        kind = " with expandable segments" if expandable_segments else ""
        traced = ", traced on fake tensors" if fake else ""
        self.name = (
            f"cpu (capped at {format_bytes(limit_bytes)}, CUDA's caching allocator{kind} modelled{traced})"
        )

    def capacity_bytes(self, resident: Iterable[torch.Tensor], wrapper_bytes: int = 0) -> int:
        return self.limit_bytes

"""Devices whose memory is a caching allocator: one ``measure`` and ``release`` for CUDA and for the CPU
standing in for a GPU with CUDA's caching allocator modelled on the model's real allocations.

The device's logic (the cap on what the allocator reserves, the cache emptied between trials, the
steady-state allocated and reserved peaks, the retries as evidence, the confirming steps) is written
once here, against an ``Allocator`` seam: ``runtime.devices.cuda`` reads and caps torch's own allocator,
``ModelledAllocator`` feeds every storage the CPU allocates to ``policy.caching_allocator``. So the
CUDA path's logic runs in CI, fragmentation included.
"""

from __future__ import annotations

import os
import re
import weakref
from collections.abc import Hashable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from batchfit.policy.allocation_record import Recording
from batchfit.policy.allocator_blocks import Block, rounded, segment_size
from batchfit.policy.caching_allocator import AllocatorOutOfMemory, CachingAllocator
from batchfit.runtime.devices.device import GarbageCollector, Measurement, unique_storages
from batchfit.runtime.devices.tracker import output_storages
from batchfit.units import format_bytes

#: Steps the answer trains before it is final on a caching allocator: under the cap its
#: fragmentation builds over the first steps. On an H100 a small CNN at a 160 MiB cap trained 2
#: steps at batch 50 and 53 and failed within 10 (docs/search.md); 10 is the truth's probe.
CONFIRM_STEPS = 10


#: Every string ``set_allocator_settings`` set, in order: an account a torch before 2.9 does not keep.
_SET_HERE: list[str] = []


def allocator_settings() -> dict[str, str]:
    """The caching allocator's settings in force (``PYTORCH_CUDA_ALLOC_CONF``'s ``key:value`` pairs,
    or ``torch.cuda.memory._set_allocator_settings``'), keys in lower case: those of the environment
    torch read them from (``PYTORCH_ALLOC_CONF`` before ``PYTORCH_CUDA_ALLOC_CONF``), updated by what
    ``set_allocator_settings`` set since, and by what someone else set last where torch tells
    (2.9 on: its account is the last string set, each setting changing the keys it names)."""
    environment = os.environ.get("PYTORCH_ALLOC_CONF") or os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or ""
    settings = _parsed(environment)
    for made in _SET_HERE:
        settings.update(_parsed(made))
    getter = getattr(torch._C, "_accelerator_getAllocatorSettings", None)
    last = getter() if getter is not None else ""
    if last and last != (_SET_HERE[-1] if _SET_HERE else environment):
        settings.update(_parsed(last))
    return settings


def set_allocator_settings(text: str) -> None:
    """Set the caching allocator's ``key:value`` settings now (torch's setter: the keys named
    change, the rest stay), and keep the account that a torch before 2.9 does not."""
    setter = getattr(torch._C, "_accelerator_setAllocatorSettings", None)
    if setter is None:
        setter = torch.cuda.memory._set_allocator_settings
    setter(text)
    _SET_HERE.append(text)


def _parsed(text: str) -> dict[str, str]:
    # A value may be a bracketed list with commas of its own: roundup_power2_divisions:[256:1,512:2].
    pairs = re.findall(r"([^,:\[\]]+):(\[[^\]]*\]|[^,]*)", text)
    return {key.strip().lower(): value.strip() for key, value in pairs if key.strip()}


def expandable_segments() -> bool:
    """Whether the caching allocator makes expandable segments (``expandable_segments:True``)."""
    return allocator_settings().get("expandable_segments", "").lower() == "true"


#: The caching allocator's settings that move where its blocks land and that its model does not
#: have: under them the trials' requests are not replayed, and the real trials alone place the
#: answer (the line, as without a forecast).
UNMODELLED_SETTINGS = ("max_split_size_mb", "roundup_power2_divisions", "garbage_collection_threshold")


def unmodelled_settings() -> list[str]:
    """The settings in force that the model of the caching allocator does not have, as ``key:value``."""
    settings = allocator_settings()
    return [f"{key}:{settings[key]}" for key in UNMODELLED_SETTINGS if key in settings]


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
    confirm_steps: int | None = CONFIRM_STEPS
    soft_workspaces = False  # the CPU's kernels take no workspace from the allocator
    # The modelled allocator sees the storages a dispatch mode sees, and Dynamo runs a step eagerly
    # under one; CUDA's own allocator serves compiled code as any other.
    measures_compiled = False
    name: str
    torch_device: torch.device

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
            # caches would let the block use more than the cap (on the H100 a batch that needs more
            # than the cap ran under it on segments an uncapped step before had left cached).
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


class ModelledAllocator:
    """CUDA's caching allocator, modelled on the CPU: every storage created in a capped block takes a
    block of ``policy.caching_allocator``, and gives it back when the storage is freed (whenever
    that is: parameters keep theirs from trial to trial, as on a GPU)."""

    def __init__(self, expandable_segments: bool = False) -> None:
        self.model = CachingAllocator(expandable=expandable_segments)
        self._blocks: dict[int, _Held] = {}  # storage key -> its block
        self._refs: dict[int, weakref.ref[torch.UntypedStorage]] = {}
        self._recording: Recording | None = None
        self._refused = ""
        self._wrapper: Block | None = None  # what the model's wrapper holds (DDP's buckets)
        self._wrapper_bytes = 0

    @contextmanager
    def capped(
        self, resident: Iterable[torch.Tensor], cap_bytes: int | None, wrapper_bytes: int
    ) -> Iterator[None]:
        self._hold_all(resident)  # allocated before the trial, outside its cap
        self._hold_wrapper(wrapper_bytes)
        # Held, not kept: a tensor the steps replace (L-BFGS's history) must be free to go, as on a GPU.
        del resident
        previous, self.model.limit_bytes = self.model.limit_bytes, cap_bytes
        self._refused = ""
        try:
            with _AllocatingMode(self):
                yield
        finally:
            self.model.limit_bytes = previous

    def hold(self, storages: Iterable[torch.UntypedStorage]) -> str | None:
        """Give each new (or grown) storage its block: None, or why one could not be placed."""
        for storage in storages:
            try:
                self._hold(storage)
            except AllocatorOutOfMemory as error:
                # In the phrases of CUDA's own message: tools that match on it recognise this one,
                # and runtime.devices.oom.fragmented reads both alike.
                model, asked = self.model, segment_size(rounded(error.nbytes))
                self._refused = (
                    f"CUDA out of memory. Tried to allocate {format_bytes(asked)}. "
                    f"CUDA's caching allocator, modelled on the CPU by batchfit: "
                    f"{format_bytes(model.limit_bytes or 0)} allowed; Of the allocated memory "
                    f"{format_bytes(model.allocated_bytes)} is allocated by PyTorch, and "
                    f"{format_bytes(model.reserved_bytes - model.allocated_bytes)} is reserved by PyTorch "
                    f"but unallocated."
                )
                return self._refused
        return None

    def peaks(self) -> tuple[int, int | None]:
        return self.model.peak_allocated_bytes, self.model.peak_reserved_bytes

    def reset(self) -> None:
        self.model.reset_peaks()

    def refused(self) -> str:
        return self._refused

    def retries(self) -> int:
        return self.model.retries

    def allocated_bytes(self) -> int:
        return self.model.allocated_bytes

    def empty_cache(self) -> None:
        self.model.empty_cache()

    def synchronize(self) -> None:
        pass

    def layout(self) -> Hashable:
        return self.model.segments()

    @contextmanager
    def recording(self) -> Iterator[Recording]:
        self._recording = Recording(self.model.segments(), self.model.expandable)
        try:
            yield self._recording
        finally:
            self._recording = None

    def _hold_all(self, tensors: Iterable[torch.Tensor]) -> None:
        for tensor in unique_storages(tensors):
            self._hold(tensor.untyped_storage())

    def _hold_wrapper(self, nbytes: int) -> None:
        """One block for what the model's wrapper holds, kept from trial to trial as the
        parameters' are (on a GPU DDP allocates its buckets once, before any trial)."""
        if nbytes == self._wrapper_bytes:
            return
        if self._wrapper is not None:
            self.model.free(self._wrapper)
        self._wrapper = self.model.malloc(nbytes) if nbytes else None
        self._wrapper_bytes = nbytes

    def _hold(self, storage: torch.UntypedStorage) -> None:
        key, nbytes = storage._cdata, storage.nbytes()
        held = self._blocks.get(key)
        if nbytes == 0 or (held is not None and held.nbytes == nbytes):
            return
        block = self.model.malloc(nbytes)  # resized: the new block, then the old freed
        recording = self._recording
        self._blocks[key] = _Held(block, nbytes, recording, recording.alloc(nbytes) if recording else None)
        if held is not None:
            self._free(held)
        if key not in self._refs:
            self._refs[key] = weakref.ref(storage, self._on_free(key))

    def _free(self, held: _Held) -> None:
        self.model.free(held.block)
        if self._recording is not None:
            self._recording.free(held.ordinal if held.recording is self._recording else None)

    def _on_free(self, key: int) -> Any:
        def free(_: object) -> None:
            self._refs.pop(key, None)
            held = self._blocks.pop(key, None)
            if held is not None:
                self._free(held)

        return free


@dataclass(frozen=True)
class _Held:
    """A storage's block, and its request's ordinal in the recording that saw it requested."""

    block: Block
    nbytes: int
    recording: Recording | None
    ordinal: int | None


class _AllocatingMode(TorchDispatchMode):
    """Hands every CPU storage an op creates to the modelled allocator; one it cannot place fails
    the op with ``torch.OutOfMemoryError``, as CUDA's allocator would."""

    def __init__(self, allocator: ModelledAllocator) -> None:
        super().__init__()
        self.allocator = allocator

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        storages = output_storages(out, "cpu")
        failure = self.allocator.hold(storages.values())
        if failure is not None:
            del out, storages  # freed now, as the failed allocation would never have been made
            raise torch.OutOfMemoryError(failure)
        return out


class CachingCpuDevice(CachingDevice):
    """The CPU standing in for a GPU of ``limit_bytes`` with CUDA's caching allocator (with
    ``expandable_segments``, as ``expandable_segments:True`` sets it): every tensor the step
    allocates is placed by the modelled allocator, so segments, fragmentation, reserved memory and
    retries behave as the allocator's rules make them (not a GPU's own kernels: cuDNN's and
    cuBLAS's workspaces are not in the CPU's allocations)."""

    torch_device = torch.device("cpu")
    min_window_steps = 1  # nothing runs ahead of the host: a step is a step

    def __init__(self, limit_bytes: int, expandable_segments: bool = False) -> None:
        super().__init__(ModelledAllocator(expandable_segments))
        self.limit_bytes = limit_bytes
        kind = " with expandable segments" if expandable_segments else ""
        self.name = f"cpu (capped at {format_bytes(limit_bytes)}, CUDA's caching allocator{kind} modelled)"

    def capacity_bytes(self, resident: Iterable[torch.Tensor], wrapper_bytes: int = 0) -> int:
        return self.limit_bytes

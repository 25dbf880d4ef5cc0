"""CUDA's caching allocator modelled on the CPU: every storage a capped block creates takes a block of
``policy.allocator.caching_allocator``, so segments, fragmentation and retries follow the allocator's
rules."""

from __future__ import annotations

import weakref
from collections.abc import Hashable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from batchfit.policy.allocator.allocation_record import Recording
from batchfit.policy.allocator.allocator_blocks import Block, rounded, segment_size
from batchfit.policy.allocator.caching_allocator import AllocatorOutOfMemory, CachingAllocator
from batchfit.runtime.devices.device import unique_storages
from batchfit.runtime.devices.tracker import output_storages
from batchfit.units import format_bytes


class ModelledAllocator:
    """CUDA's caching allocator, modelled on the CPU: every storage created in a capped block takes a
    block of ``policy.allocator.caching_allocator``, and gives it back when the storage is freed (whenever
    that is: parameters keep theirs from trial to trial, as on a GPU). ``fake``: the storages of
    fake tensors are placed instead of real ones (a trace of the step, which allocates nothing)."""

    def __init__(self, expandable_segments: bool = False, fake: bool = False) -> None:
        self.model = CachingAllocator(expandable=expandable_segments)
        self.fake = fake
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
        storages = output_storages(out, "cpu", self.allocator.fake)
        failure = self.allocator.hold(storages.values())
        if failure is not None:
            del out, storages  # freed now, as the failed allocation would never have been made
            raise torch.OutOfMemoryError(failure)
        return out

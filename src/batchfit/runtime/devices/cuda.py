"""A CUDA (or ROCm) GPU as a ``Device``: torch's caching allocator behind ``CachingDevice``'s seam,
capped by the per-process memory fraction, the user's own fraction put back."""

from __future__ import annotations

import logging
from collections.abc import Hashable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from batchfit.errors import DeviceUnavailableError
from batchfit.policy.allocator.allocation_record import Recording
from batchfit.runtime.devices.allocator_settings import expandable_segments, unmodelled_settings
from batchfit.runtime.devices.caching_device import CONFIRM_STEPS, EXPANDABLE_CONFIRM_STEPS, CachingDevice
from batchfit.runtime.devices.cuda_history import (
    MAX_TRACE_ENTRIES,
    HistoryRecording,
    allocator_start,
    device_segments,
    history,
    history_free,
    read_trace,
)
from batchfit.runtime.devices.device import BucketHolding
from batchfit.units import format_bytes

logger = logging.getLogger(__name__)

#: The fewest steps in an explore window on CUDA. Each window starts on an idle, synchronised GPU,
#: so its first step pays the launch ramp and the unhidden batch copy that back-to-back training
#: steps overlap; one-step windows under-read small batches, where that ramp weighs most.
WINDOW_STEPS = 3


class CudaDevice(CachingDevice):
    """A CUDA (or ROCm) GPU. The cap is the caching allocator's own per-process memory fraction,
    so the allocator frees its cache and retries before it fails, as it does in training."""

    min_window_steps = WINDOW_STEPS
    # cuDNN catches the allocator's out-of-memory for a workspace and runs an algorithm that needs
    # a smaller one: near the cap a workspace that does not fit does not fail the step.
    soft_workspaces = True
    measures_compiled = True  # compiled kernels allocate from the caching allocator as eager ones do
    bucket_holding: BucketHolding = "beside"  # DDP allocated its buckets here before the search

    def __init__(self, index: int, limit_bytes: int | None = None) -> None:
        self.torch_device = torch.device("cuda", index)
        super().__init__(_CudaAllocator(self.torch_device))
        self.limit_bytes = limit_bytes
        self.name = f"cuda:{index}"
        if limit_bytes is not None:
            self.name += f" (capped at {format_bytes(limit_bytes)})"
        self._confirm_steps: int | None = None  # set by hand (the Device protocol's attribute)

    @property
    def confirm_steps(self) -> int | None:
        """``CONFIRM_STEPS``, or ``EXPANDABLE_CONFIRM_STEPS`` while the allocator makes expandable
        segments (read at each search: ``compare`` turns them on for a row), unless set."""
        if self._confirm_steps is not None:
            return self._confirm_steps
        return EXPANDABLE_CONFIRM_STEPS if expandable_segments() else CONFIRM_STEPS

    @confirm_steps.setter
    def confirm_steps(self, steps: int | None) -> None:
        self._confirm_steps = steps

    def capacity_bytes(self, resident: Iterable[torch.Tensor], wrapper_bytes: int = 0) -> int:
        free_bytes, total_bytes = cuda_call(torch.cuda.mem_get_info, self.torch_device)
        reserved = cuda_call(torch.cuda.memory_reserved, self.torch_device, allow_zero=True)
        # What this process could hold: free memory plus what its allocator already caches, within
        # the memory fraction the user set for it (training runs under that cap too).
        allowed = int(user_memory_fraction(self.torch_device.index or 0) * total_bytes)
        capacity = min(total_bytes, free_bytes + reserved, allowed)
        return int(capacity if self.limit_bytes is None else min(capacity, self.limit_bytes))


class _CudaAllocator:
    """torch's caching allocator on one GPU, as ``CachingDevice`` reads and caps it."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    @contextmanager
    def capped(
        self, resident: Iterable[torch.Tensor], cap_bytes: int | None, wrapper_bytes: int
    ) -> Iterator[None]:
        """The per-process memory fraction at ``cap_bytes``, and the user's own put back."""
        # The allocator knows what is held (DDP's buckets are its blocks already); a tensor the
        # steps replace must be free to go.
        del resident, wrapper_bytes
        if cap_bytes is None:
            yield
            return
        index = self.device.index
        total = int(cuda_call(torch.cuda.mem_get_info, self.device)[1])
        previous = user_memory_fraction(index or 0)
        torch.cuda.set_per_process_memory_fraction(min(1.0, cap_bytes / total), index)
        try:
            yield
        finally:
            torch.cuda.set_per_process_memory_fraction(previous, index)

    def peaks(self) -> tuple[int, int | None]:
        # The allocator's statistics are kept on the host as it allocates: no synchronisation.
        return (
            int(torch.cuda.max_memory_allocated(self.device)),
            int(torch.cuda.max_memory_reserved(self.device)),
        )

    def reset(self) -> None:
        torch.cuda.reset_peak_memory_stats(self.device)

    def refused(self) -> str:
        return ""  # the allocator enforces the cap itself, and its message survives a re-raise

    def retries(self) -> int:
        stats = cuda_call(torch.cuda.memory_stats, self.device, allow_zero=True)
        return int(stats.get("num_alloc_retries", 0)) if stats else 0

    def allocated_bytes(self) -> int:
        return int(cuda_call(torch.cuda.memory_allocated, self.device, allow_zero=True))

    def empty_cache(self) -> None:
        cuda_call(torch.cuda.empty_cache, allow_zero=True)

    def synchronize(self) -> None:
        # Not through cuda_call: this is where an asynchronous CUDA error (a device-side assert in
        # the user's step) surfaces, and it must reach the user as it is.
        torch.cuda.synchronize(self.device)

    def layout(self) -> Hashable:
        # The allocator's own account of its segments and blocks, read on the host (no sync). An
        # expandable segment's mapped stretches are placed by their offsets from its first.
        segments = device_segments(torch.cuda.memory_snapshot(), self.device.index)
        first: dict[tuple[Any, Any], int] = {}
        for segment in segments:
            if segment.get("is_expandable", False):
                first.setdefault((segment["stream"], segment["segment_type"]), segment["address"])
        return tuple(
            (
                segment["stream"],
                segment["segment_type"],
                segment["address"]
                - first.get((segment["stream"], segment["segment_type"]), segment["address"]),
                _blocks(segment),
            )
            for segment in segments
        )

    @contextmanager
    def recording(self) -> Iterator[Recording | None]:
        """The allocator's own history (``torch.cuda.memory._record_memory_history``, no stack
        traces) over the block, read back into a ``Recording`` at its end; the history is turned
        off after (which clears it). None where there is no such history to read: a torch without
        it, an allocator that keeps none (``cudaMallocAsync``), or a user who records one already
        (theirs is left as it is); and where the model could not replay it: allocator settings it
        does not have (``runtime.devices.allocator_settings.UNMODELLED_SETTINGS``), or a start it
        cannot take."""
        index = self.device.index or 0
        unmodelled = unmodelled_settings()
        if unmodelled:
            logger.debug("no record: the model of CUDA's allocator does not have %s", ", ".join(unmodelled))
            yield None
            return
        if not history_free():
            yield None
            return
        snapshot = torch.cuda.memory_snapshot()
        start = allocator_start(snapshot, self.device.index, expandable_segments())
        if start is None:
            yield None
            return
        try:
            torch.cuda.memory._record_memory_history(
                enabled="all", context=None, max_entries=MAX_TRACE_ENTRIES
            )
        except (TypeError, RuntimeError) as error:  # another signature, or a backend without history
            logger.debug("no allocator history to record the trial's requests: %s", error)
            yield None
            return
        try:
            recording = HistoryRecording(*start, index)
            yield recording
            entries = history(index)[recording.begin :]
            starts = [position - recording.begin for position in recording.starts]
            # Where the start's segments lie: the record places the trial's new ones among them.
            bases = None if start[1] else [s["address"] for s in device_segments(snapshot, self.device.index)]
            read_trace(entries, starts, recording, MAX_TRACE_ENTRIES - recording.begin, bases)
        finally:
            torch.cuda.memory._record_memory_history(enabled=None)


def _blocks(segment: Any) -> tuple[tuple[int, str], ...]:
    return tuple((block["size"], block["state"]) for block in segment["blocks"])


def user_memory_fraction(index: int) -> float:
    """The per-process memory fraction in force on CUDA device ``index`` (1.0 unless the user set
    one); torch builds without the getter (before 2.8) report the allocator's default, 1.0."""
    getter = getattr(torch.cuda, "get_per_process_memory_fraction", None)
    return 1.0 if getter is None else float(getter(index))


def cuda_call(function: Any, *args: Any, allow_zero: bool = False) -> Any:
    """Call a torch.cuda memory function; a failure or a 0 reading is an error, not a number."""
    name = getattr(function, "__name__", str(function))
    try:
        value = function(*args)
    except Exception as error:
        raise DeviceUnavailableError(
            f"torch.cuda.{name} failed ({error}); batchfit cannot measure CUDA memory here. "
            f"Check that this torch build has CUDA (torch.version.cuda={torch.version.cuda})."
        ) from error
    if not allow_zero and (value == 0 or (isinstance(value, tuple) and 0 in value)):
        raise DeviceUnavailableError(
            f"torch.cuda.{name} returned 0, which is not a real measurement; this torch build "
            f"(torch.version.cuda={torch.version.cuda}) may lack CUDA support."
        )
    return value

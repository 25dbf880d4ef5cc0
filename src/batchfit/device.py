"""Devices a search runs on: one interface, three implementations (CPU, capped CPU, CUDA).

A device knows its capacity in bytes and measures the peak memory of a block of work. The CPU
devices count live tensor storages with ``StorageTracker``; CUDA reads the caching allocator's
statistics, checked against reserved memory (what the device really holds).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
import os
import platform
import resource
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from batchfit.errors import ConfigurationError, DeviceUnavailableError
from batchfit.tracker import StorageTracker
from batchfit.units import format_bytes, parse_bytes


@dataclass
class Measurement:
    """What a device saw during one measured block.

    Where the device can split its peak by phase (the CPU devices), ``optimizer_peak_bytes`` is
    the peak inside ``optimizer.step`` and ``activation_peak_bytes`` the peak outside it: the
    first does not grow with the batch, the second does, and the memory model fits them apart.
    """

    peak_bytes: int = 0
    allocator_retries: int = 0
    optimizer_peak_bytes: int | None = None
    activation_peak_bytes: int | None = None
    _tracker: StorageTracker | None = None

    def enter_optimizer_step(self) -> None:
        if self._tracker is not None:
            self.activation_peak_bytes = max(self.activation_peak_bytes or 0, self._tracker.peak_bytes)
            self._tracker.reset_peak()

    def exit_optimizer_step(self) -> None:
        if self._tracker is not None:
            self.optimizer_peak_bytes = max(self.optimizer_peak_bytes or 0, self._tracker.peak_bytes)
            self._tracker.reset_peak()


class Device(Protocol):
    """The memory interface a search needs from a device."""

    name: str
    torch_device: torch.device
    exact: bool  # measurements repeat to the byte and a failure leaves nothing behind

    def capacity_bytes(self, resident: Iterable[torch.Tensor]) -> int:
        """Bytes the workload may use in all, counting the ``resident`` tensors it already holds."""
        ...

    def measure(self, resident: Iterable[torch.Tensor]) -> Any:
        """A context manager yielding a ``Measurement`` filled in when the block exits."""
        ...

    def synchronize(self) -> None: ...

    def release(self) -> None:
        """Give cached memory back after a trial (after a failure above all)."""
        ...


class CpuDevice:
    """The host CPU; capacity is what the process can really use (RAM, cgroup, RLIMIT_AS)."""

    name = "cpu"
    torch_device = torch.device("cpu")
    exact = False

    def __init__(self, *, fake: bool = False) -> None:
        self.fake = fake  # measure fake tensors: a trace, not a run

    def capacity_bytes(self, resident: Iterable[torch.Tensor]) -> int:
        held = sum(tensor.untyped_storage().nbytes() for tensor in _unique_storages(resident))
        return host_available_bytes() + held

    @contextmanager
    def measure(self, resident: Iterable[torch.Tensor]) -> Iterator[Measurement]:
        tracker = self._tracker()
        tracker.track(_unique_storages(resident))
        measurement = Measurement(_tracker=tracker)
        try:
            with tracker:
                yield measurement
        finally:
            measurement.enter_optimizer_step()  # closes the last phase outside the step
            measurement.peak_bytes = max(
                measurement.activation_peak_bytes or 0, measurement.optimizer_peak_bytes or 0
            )
            measurement._tracker = None

    def _tracker(self) -> StorageTracker:
        return StorageTracker(fake=self.fake)

    def synchronize(self) -> None:
        pass

    def release(self) -> None:
        # A trial's garbage is young: collecting the two younger generations frees its cycles
        # (an exception's traceback and the frames it holds) without walking all of torch.
        gc.collect(1)
        _malloc_trim()


class CappedCpuDevice(CpuDevice):
    """The CPU with a hard capacity: an allocation past it raises ``torch.OutOfMemoryError``."""

    exact = True

    def __init__(self, limit_bytes: int) -> None:
        super().__init__()
        self.limit_bytes = limit_bytes
        self.name = f"cpu (capped at {format_bytes(limit_bytes)})"

    def capacity_bytes(self, resident: Iterable[torch.Tensor]) -> int:
        return self.limit_bytes

    def _tracker(self) -> StorageTracker:
        return StorageTracker(capacity_bytes=self.limit_bytes)


class CudaDevice:
    """A CUDA (or ROCm) GPU, measured through torch.cuda's allocator statistics."""

    exact = False

    def __init__(self, index: int, limit_bytes: int | None = None) -> None:
        self.torch_device = torch.device("cuda", index)
        self.limit_bytes = limit_bytes
        self.name = f"cuda:{index}"

    def capacity_bytes(self, resident: Iterable[torch.Tensor]) -> int:
        free_bytes, total_bytes = _cuda_call(torch.cuda.mem_get_info, self.torch_device)
        reserved = _cuda_call(torch.cuda.memory_reserved, self.torch_device, allow_zero=True)
        # What this process could hold: free memory plus what its allocator already caches.
        capacity = min(total_bytes, free_bytes + reserved)
        return int(capacity if self.limit_bytes is None else min(capacity, self.limit_bytes))

    @contextmanager
    def measure(self, resident: Iterable[torch.Tensor]) -> Iterator[Measurement]:
        measurement = Measurement()
        _cuda_call(torch.cuda.synchronize, self.torch_device, allow_zero=True)
        _cuda_call(torch.cuda.reset_peak_memory_stats, self.torch_device, allow_zero=True)
        retries_before = self._retries()
        try:
            yield measurement
        finally:
            _cuda_call(torch.cuda.synchronize, self.torch_device, allow_zero=True)
            measurement.peak_bytes = _cuda_call(torch.cuda.max_memory_reserved, self.torch_device)
            measurement.allocator_retries = self._retries() - retries_before

    def _retries(self) -> int:
        stats = _cuda_call(torch.cuda.memory_stats, self.torch_device, allow_zero=True)
        return int(stats.get("num_alloc_retries", 0)) if stats else 0

    def synchronize(self) -> None:
        _cuda_call(torch.cuda.synchronize, self.torch_device, allow_zero=True)

    def release(self) -> None:
        gc.collect()
        _cuda_call(torch.cuda.empty_cache, allow_zero=True)


def _cuda_call(function: Any, *args: Any, allow_zero: bool = False) -> Any:
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


@functools.cache
def _libc() -> Any:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def _malloc_trim() -> None:
    """Hand freed heap memory back to the OS (glibc only), so the next trial starts lean."""
    trim = getattr(_libc(), "malloc_trim", None)
    if trim is not None:
        trim(0)


#: glibc malloc settings that keep CPU throughput independent of what the process ran before: a
#: fixed mmap threshold (32 MiB, the largest glibc accepts) and a trim threshold above any heap
#: the step uses. glibc reads them from the environment once, at start-up.
PINNED_MALLOC = {"MALLOC_MMAP_THRESHOLD_": str(32 * 2**20), "MALLOC_TRIM_THRESHOLD_": str(4 * 2**30)}


def malloc_thresholds_move(environ: dict[str, str] | None = None) -> bool:
    """Whether this process runs on glibc's malloc with its dynamic mmap threshold: the threshold
    rises each time a large block is freed, so whether a step's tensors come from the heap or from
    fresh, page-faulted mappings depends on which batch sizes ran before. Setting either threshold
    (``MALLOC_*_THRESHOLD_`` or ``GLIBC_TUNABLES``) fixes it."""
    environ = dict(os.environ) if environ is None else environ
    if platform.libc_ver()[0] != "glibc":
        return False
    if any(key in environ for key in PINNED_MALLOC):
        return False
    return not any(
        name in environ.get("GLIBC_TUNABLES", "")
        for name in ("glibc.malloc.mmap_threshold", "glibc.malloc.trim_threshold")
    )


def resolve_device(device: str | torch.device | None, memory_limit: str | int | None) -> Device:
    """Turn the user's ``device`` and ``memory_limit`` into a ``Device``; errors say what to pass."""
    limit = None if memory_limit is None else parse_bytes(memory_limit, name="memory_limit")
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise ConfigurationError(
            f"device={device!r} is not a device: use 'cpu', 'cuda' or 'cuda:N'."
        ) from error
    if parsed.type == "cpu":
        return CpuDevice() if limit is None else CappedCpuDevice(limit)
    if parsed.type == "cuda":
        if not torch.cuda.is_available():
            raise DeviceUnavailableError(
                f"device={device!r} was asked for, but CUDA is not available in this process "
                f"(torch {torch.__version__}, torch.version.cuda={torch.version.cuda}). "
                f"Use device='cpu' (with memory_limit='...' to stand in for a GPU's memory)."
            )
        index = parsed.index if parsed.index is not None else torch.cuda.current_device()
        if index >= torch.cuda.device_count():
            raise DeviceUnavailableError(
                f"device={device!r} does not exist: {torch.cuda.device_count()} CUDA device(s) "
                f"are visible; use cuda:0 to cuda:{torch.cuda.device_count() - 1}."
            )
        return CudaDevice(index, limit)
    raise ConfigurationError(
        f"device={device!r} is not supported: batchfit measures 'cpu' and 'cuda' devices."
    )


def _unique_storages(tensors: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    seen: dict[int, torch.Tensor] = {}
    for tensor in tensors:
        seen.setdefault(tensor.untyped_storage()._cdata, tensor)
    return list(seen.values())


def host_available_bytes() -> int:
    """Bytes this process can still allocate: the least of free RAM, cgroup and RLIMIT_AS room."""
    candidates = [_meminfo_available()]
    candidates.append(_cgroup_headroom())
    candidates.append(_rlimit_as_headroom())
    known = [value for value in candidates if value is not None]
    if not known:
        pages = os.sysconf("SC_PHYS_PAGES") if hasattr(os, "sysconf") else 0
        return int(pages * os.sysconf("SC_PAGE_SIZE")) if pages else 0
    return max(0, min(known))


def _read(path: str) -> str | None:
    try:
        with open(path) as handle:
            return handle.read().strip()
    except OSError:
        return None


def _meminfo_available() -> int | None:
    text = _read("/proc/meminfo")
    if text is None:
        return None
    for line in text.splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return None


def _cgroup_headroom() -> int | None:
    limit, usage = _read("/sys/fs/cgroup/memory.max"), _read("/sys/fs/cgroup/memory.current")
    if limit is None:  # cgroup v1
        limit = _read("/sys/fs/cgroup/memory/memory.limit_in_bytes")
        usage = _read("/sys/fs/cgroup/memory/memory.usage_in_bytes")
    if limit is None or usage is None or limit == "max" or int(limit) >= 2**60:
        return None
    return int(limit) - int(usage)


def _rlimit_as_headroom() -> int | None:
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None
    status = _read("/proc/self/status") or ""
    for line in status.splitlines():
        if line.startswith("VmSize:"):
            return soft - int(line.split()[1]) * 1024
    return soft

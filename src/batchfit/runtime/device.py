"""Devices a search runs on: one interface, three implementations (CPU, capped CPU, CUDA).

A device knows its capacity in bytes, runs a block of work under a hard cap and measures its
peaks. The CPU devices count live tensor storages with ``StorageTracker``, which also enforces
the cap; CUDA caps its caching allocator and reads the allocator's statistics.
"""

from __future__ import annotations

import functools
import gc
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from batchfit.errors import ConfigurationError, DeviceUnavailableError
from batchfit.runtime.host import host_available_bytes, malloc_trim
from batchfit.runtime.tracker import StorageTracker, resident_oom_message, resident_tensors
from batchfit.units import format_bytes, parse_bytes


class Probe(Protocol):
    """Where a device reads its memory peaks since the last reset: allocated and, for a device with
    a caching allocator, reserved bytes (None where nothing is cached)."""

    def peaks(self) -> tuple[int, int | None]: ...

    def reset(self) -> None: ...


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
    _probe: Probe | None = None

    def begin_step(self) -> None:
        if self._probe is not None:
            self._probe.reset()
        self.optimizer_peak_bytes = self.activation_peak_bytes = self.reserved_peak_bytes = None

    def enter_optimizer_step(self) -> None:
        self.activation_peak_bytes = self._close_phase(self.activation_peak_bytes)

    def exit_optimizer_step(self) -> None:
        self.optimizer_peak_bytes = self._close_phase(self.optimizer_peak_bytes)

    def finish(self) -> None:
        """Close the last phase (outside any optimizer step) and stop reading the device."""
        self.enter_optimizer_step()
        self.peak_bytes = max(self.activation_peak_bytes or 0, self.optimizer_peak_bytes or 0)
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

    def capacity_bytes(self, resident: Iterable[torch.Tensor]) -> int:
        """Bytes the workload may use in all, counting the ``resident`` tensors it already holds."""
        ...

    def measure(
        self, resident: Iterable[torch.Tensor], cap_bytes: int | None = None
    ) -> AbstractContextManager[Measurement]:
        """A block under a hard cap (none when None), yielding a ``Measurement`` filled in at exit."""
        ...

    def synchronize(self) -> None: ...

    def release(self) -> None:
        """Give back what earlier trials left cached (after a failure above all)."""
        ...


class CpuDevice:
    """The host CPU; capacity is what the process can really use (RAM, cgroup, RLIMIT_AS).

    The cap is enforced by a ``StorageTracker`` on the live tensor storages, to the byte.
    """

    name = "cpu"
    torch_device = torch.device("cpu")
    exact = False  # a real allocator failure (RLIMIT_AS) can leave the heap larger than it was

    def __init__(self, *, fake: bool = False) -> None:
        self.fake = fake  # measure fake tensors: a trace, not a run

    def capacity_bytes(self, resident: Iterable[torch.Tensor]) -> int:
        held = sum(tensor.untyped_storage().nbytes() for tensor in _unique_storages(resident))
        return host_available_bytes() + held

    @contextmanager
    def measure(
        self, resident: Iterable[torch.Tensor], cap_bytes: int | None = None
    ) -> Iterator[Measurement]:
        tracker = StorageTracker(capacity_bytes=cap_bytes, fake=self.fake)
        tracker.track(_unique_storages(resident))
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

    def release(self) -> None:
        # A trial's garbage is young: collecting the two younger generations frees its cycles
        # (an exception's traceback and the frames it holds) without walking all of torch.
        gc.collect(1)
        malloc_trim()


class CappedCpuDevice(CpuDevice):
    """The CPU with a fixed capacity, ``limit_bytes``: it stands in for a GPU of that size."""

    exact = True

    def __init__(self, limit_bytes: int) -> None:
        super().__init__()
        self.limit_bytes = limit_bytes
        self.name = f"cpu (capped at {format_bytes(limit_bytes)})"

    def capacity_bytes(self, resident: Iterable[torch.Tensor]) -> int:
        return self.limit_bytes


class _TrackerProbe:
    def __init__(self, tracker: StorageTracker) -> None:
        self.tracker = tracker

    def peaks(self) -> tuple[int, int | None]:
        return self.tracker.peak_bytes, None  # storages are allocated as they are counted

    def reset(self) -> None:
        self.tracker.reset_peak()


class CudaDevice:
    """A CUDA (or ROCm) GPU. The cap is the caching allocator's own per-process memory fraction,
    so the allocator frees its cache and retries before it fails, as it does in training; the
    measurements are its allocated and reserved peaks and its retries."""

    exact = True  # release() empties the cache: a failed trial leaves nothing behind

    def __init__(self, index: int, limit_bytes: int | None = None) -> None:
        self.torch_device = torch.device("cuda", index)
        self.limit_bytes = limit_bytes
        self.name = f"cuda:{index}"
        if limit_bytes is not None:
            self.name += f" (capped at {format_bytes(limit_bytes)})"

    def total_bytes(self) -> int:
        return int(_cuda_call(torch.cuda.mem_get_info, self.torch_device)[1])

    def capacity_bytes(self, resident: Iterable[torch.Tensor]) -> int:
        free_bytes, total_bytes = _cuda_call(torch.cuda.mem_get_info, self.torch_device)
        reserved = _cuda_call(torch.cuda.memory_reserved, self.torch_device, allow_zero=True)
        # What this process could hold: free memory plus what its allocator already caches.
        capacity = min(total_bytes, free_bytes + reserved)
        return int(capacity if self.limit_bytes is None else min(capacity, self.limit_bytes))

    @contextmanager
    def measure(
        self, resident: Iterable[torch.Tensor], cap_bytes: int | None = None
    ) -> Iterator[Measurement]:
        self.synchronize()
        with self._capped(cap_bytes):
            retries_before = self._retries()
            measurement = Measurement(_probe=_AllocatorProbe(self.torch_device))
            measurement.begin_step()
            try:
                yield measurement
            finally:
                try:
                    self.synchronize()  # the last kernels' allocations are in the statistics
                finally:
                    measurement.finish()
                    measurement.allocator_retries = self._retries() - retries_before

    @contextmanager
    def _capped(self, cap_bytes: int | None) -> Iterator[None]:
        """The caching allocator capped at ``cap_bytes``, and the user's own fraction put back."""
        if cap_bytes is None:
            yield
            return
        index = self.torch_device.index
        previous = user_memory_fraction(index)
        torch.cuda.set_per_process_memory_fraction(min(1.0, cap_bytes / self.total_bytes()), index)
        try:
            yield
        finally:
            torch.cuda.set_per_process_memory_fraction(previous, index)

    def _retries(self) -> int:
        stats = _cuda_call(torch.cuda.memory_stats, self.torch_device, allow_zero=True)
        return int(stats.get("num_alloc_retries", 0)) if stats else 0

    def synchronize(self) -> None:
        _cuda_call(torch.cuda.synchronize, self.torch_device, allow_zero=True)

    def release(self) -> None:
        gc.collect()
        _cuda_call(torch.cuda.empty_cache, allow_zero=True)


class _AllocatorProbe:
    def __init__(self, device: torch.device) -> None:
        self.device = device

    def peaks(self) -> tuple[int, int | None]:
        # The allocator's statistics are kept on the host as it allocates: no synchronisation.
        return (
            int(torch.cuda.max_memory_allocated(self.device)),
            int(torch.cuda.max_memory_reserved(self.device)),
        )

    def reset(self) -> None:
        torch.cuda.reset_peak_memory_stats(self.device)


def user_memory_fraction(index: int) -> float:
    """The per-process memory fraction in force on CUDA device ``index`` (1.0 unless the user set
    one); torch builds without the getter (before 2.8) report the allocator's default, 1.0."""
    getter = getattr(torch.cuda, "get_per_process_memory_fraction", None)
    return 1.0 if getter is None else float(getter(index))


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
def parse_device(device: str | torch.device | None) -> torch.device:
    """The torch device the user means: ``cpu``, ``cuda`` (the current one) or ``cuda:N``, and for
    None cuda if available, else cpu. Errors say what to pass."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise ConfigurationError(
            f"device={device!r} is not a device: use 'cpu', 'cuda' or 'cuda:N'."
        ) from error
    if parsed.type == "cpu":
        return torch.device("cpu")
    if parsed.type != "cuda":
        raise ConfigurationError(
            f"device={device!r} is not supported: batchfit measures 'cpu' and 'cuda' devices."
        )
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
    return torch.device("cuda", index)


def resolve_device(device: str | torch.device | None, memory_limit: str | int | None) -> Device:
    """Turn the user's ``device`` and ``memory_limit`` into a ``Device``: on the CPU the limit is
    its capacity (it stands in for a GPU of that size); on CUDA it lowers the GPU's capacity."""
    limit = None if memory_limit is None else parse_bytes(memory_limit, name="memory_limit")
    parsed = parse_device(device)
    if parsed.type == "cpu":
        return CpuDevice() if limit is None else CappedCpuDevice(limit)
    return CudaDevice(parsed.index or 0, limit)


@contextmanager
def memory_limit(
    limit: str | int, *, resident: Iterable[Any] = (), device: str | torch.device = "cpu"
) -> Iterator[Measurement]:
    """Cap the memory of the code inside the block at ``limit`` (e.g. ``"2GiB"``), as a device of
    that size would: an allocation past it raises ``torch.OutOfMemoryError``.

    On the CPU, tensors allocated inside the block count, plus those of ``resident`` (modules,
    optimizers, tensors) that already exist. On CUDA (``device="cuda"``), the caching
    allocator of the whole process is capped, and the fraction in force before is put back after.
    The yielded measurement's ``peak_bytes`` is filled in when the block exits.
    """
    target = resolve_device(device, None)
    with target.measure(resident_tensors(*resident), parse_bytes(limit, name="limit")) as measurement:
        yield measurement


def _unique_storages(tensors: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    seen: dict[int, torch.Tensor] = {}
    for tensor in tensors:
        seen.setdefault(tensor.untyped_storage()._cdata, tensor)
    return list(seen.values())

"""The host: how much memory the CPU may use (cgroup, RLIMIT_AS, MemAvailable), the cores it may
run on, and glibc's malloc, whose moving thresholds make CPU throughput depend on what ran before."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import platform
import resource
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@functools.cache
def _libc() -> Any:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def malloc_trim() -> None:
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


def malloc_advice(environ: dict[str, str] | None = None) -> str | None:
    """What to set for steady CPU throughput, when glibc's thresholds move in this process; else None."""
    if not malloc_thresholds_move(environ):
        return None
    pinned = " ".join(f"{key}={value}" for key, value in PINNED_MALLOC.items())
    return (
        "glibc's malloc moves its thresholds as the process runs, so on the CPU a batch size's "
        "throughput depends on which sizes ran before it; for steady figures (and often faster "
        f"training) run with {pinned}, in training too."
    )


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity mask, which taskset and cgroup cpusets
    narrow), else the machine's count."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


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
    size = _status_bytes("VmSize:")
    return soft if size is None else soft - size


@contextmanager
def data_limited(room_bytes: int) -> Iterator[None]:
    """A block in which the process's data segment (``RLIMIT_DATA``: its heap and private
    mappings, where the CPU allocator's blocks live) may grow by ``room_bytes`` at most, so that
    an allocation past it fails as the CPU allocator's out-of-memory instead of the kernel killing
    the process; a lower limit of the user's own is kept, and the one in force put back after.
    Where the data segment cannot be read (not Linux), the block runs without."""
    data = _status_bytes("VmData:")
    if data is None or room_bytes <= 0:
        yield
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    wanted = data + room_bytes
    if soft != resource.RLIM_INFINITY and soft <= wanted:
        yield  # the user's own limit is lower already
        return
    limit = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    resource.setrlimit(resource.RLIMIT_DATA, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))


def _status_bytes(field: str) -> int | None:
    """A ``/proc/self/status`` field in bytes (``VmData:``, ``VmSize:``), None where there is none."""
    for line in (_read("/proc/self/status") or "").splitlines():
        if line.startswith(field):
            return int(line.split()[1]) * 1024
    return None

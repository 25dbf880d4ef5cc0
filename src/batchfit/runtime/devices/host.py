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
from dataclasses import dataclass
from typing import Any

from batchfit.units import format_bytes


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


@dataclass(frozen=True)
class HostMemory:
    """What this process can still allocate, by source, in bytes (None where a source sets no
    limit or cannot be read): free RAM (``MemAvailable``), the room its cgroup's limit leaves
    (v2 ``memory.max`` or v1 ``memory.limit_in_bytes``, less the usage, its ancestors' too) and
    the room ``RLIMIT_AS`` leaves over the address space it already maps (``ulimit -v``)."""

    free_ram_bytes: int | None
    cgroup_room_bytes: int | None
    rlimit_room_bytes: int | None

    @property
    def available_bytes(self) -> int:
        """The least of the three: an allocation past it fails in the host's own allocator."""
        known = [value for value in self._sources().values() if value is not None]
        if not known:  # nothing readable (not Linux): the machine's RAM
            pages = os.sysconf("SC_PHYS_PAGES") if hasattr(os, "sysconf") else 0
            return int(pages * os.sysconf("SC_PAGE_SIZE")) if pages else 0
        return max(0, min(known))

    def describe(self) -> str:
        """``the least of free RAM 23.10 GiB and RLIMIT_AS's room 180.00 MiB``: where the figure
        comes from, for a message."""
        sources = self._sources().items()
        known = [f"{name} {format_bytes(max(0, value))}" for name, value in sources if value is not None]
        if len(known) < 2:
            return known[0] if known else "the machine's RAM"
        return f"the least of {', '.join(known[:-1])} and {known[-1]}"

    def _sources(self) -> dict[str, int | None]:
        return {
            "free RAM": self.free_ram_bytes,
            "the cgroup's room": self.cgroup_room_bytes,
            "RLIMIT_AS's room": self.rlimit_room_bytes,
        }


def host_memory() -> HostMemory:
    """What this process can still allocate now (``HostMemory``)."""
    return HostMemory(_meminfo_available(), _cgroup_headroom(), _rlimit_as_headroom())


def host_available_bytes() -> int:
    """Bytes this process can still allocate: the least of free RAM, cgroup and RLIMIT_AS room."""
    return host_memory().available_bytes


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


#: Where the cgroup hierarchies are mounted, and each version's limit and usage files.
CGROUP_ROOT = "/sys/fs/cgroup"
_CGROUP_FILES = {
    "v2": ("memory.max", "memory.current"),
    "v1": ("memory.limit_in_bytes", "memory.usage_in_bytes"),
}


def _cgroup_headroom(root: str = CGROUP_ROOT, membership: str | None = None) -> int | None:
    """The least room the memory limits of this process's cgroup and its ancestors leave (None
    where none is set): ``membership`` is ``/proc/self/cgroup``'s text, ``root`` the mount."""
    membership = _read("/proc/self/cgroup") if membership is None else membership
    rooms = [
        int(limit) - int(usage)
        for limit, usage in (
            (_read(f"{folder}/{limit_file}"), _read(f"{folder}/{usage_file}"))
            for folder, (limit_file, usage_file) in _cgroup_folders(root, membership or "")
        )
        if limit is not None and usage is not None and limit != "max" and int(limit) < 2**60
    ]
    return min(rooms) if rooms else None


def _cgroup_folders(root: str, membership: str) -> list[tuple[str, tuple[str, str]]]:
    """The memory cgroup folders that bound this process, its own first, then its ancestors up to
    the mount (in a cgroup namespace its own is the mount itself: ``/``)."""
    found: list[tuple[str, tuple[str, str]]] = []
    for line in membership.splitlines():
        hierarchy, _, path = line.partition(":")[2].partition(":")
        if hierarchy == "":  # v2's one hierarchy: "0::/path"
            version, mount = "v2", root
        elif "memory" in hierarchy.split(","):  # v1's memory controller: "4:memory:/path"
            version, mount = "v1", f"{root}/memory"
        else:
            continue
        parts = [part for part in path.split("/") if part]
        for depth in range(len(parts), -1, -1):
            folder = "/".join([mount, *parts[:depth]])
            if os.path.isdir(folder):
                found.append((folder, _CGROUP_FILES[version]))
    if not found:  # no membership to read: the mount's own files
        found = [(root, _CGROUP_FILES["v2"]), (f"{root}/memory", _CGROUP_FILES["v1"])]
    return found


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

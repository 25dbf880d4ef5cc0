"""The host's memory and glibc's malloc: what the uncapped CPU may use, and when steady
throughput needs pinned thresholds."""

from __future__ import annotations

import platform
import resource
from pathlib import Path

import pytest
import torch
from rlimit_child import vm_size_bytes

from batchfit.runtime.devices.host import (
    PINNED_MALLOC,
    data_limited,
    host_available_bytes,
    malloc_advice,
    malloc_thresholds_move,
)
from batchfit.runtime.devices.oom import is_out_of_memory


def test_host_capacity_is_bounded_by_ram_and_rlimit() -> None:
    available = host_available_bytes()
    with open("/proc/meminfo") as handle:
        meminfo = dict(line.split(":", 1) for line in handle.read().splitlines())
    assert 0 < available <= int(meminfo["MemAvailable"].split()[0]) * 1024 * 1.05
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:  # headroom under an address-space limit is what counts
        resource.setrlimit(resource.RLIMIT_AS, (vm_size_bytes() + 500 * 2**20, hard))
        try:
            assert host_available_bytes() <= 500 * 2**20
        finally:
            resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def test_malloc_thresholds_move_only_on_glibc_left_to_its_defaults() -> None:
    on_glibc = platform.libc_ver()[0] == "glibc"
    assert malloc_thresholds_move({}) is on_glibc
    assert malloc_thresholds_move({"PATH": "/usr/bin"}) is on_glibc
    assert not malloc_thresholds_move(dict(PINNED_MALLOC))
    assert not malloc_thresholds_move({"MALLOC_MMAP_THRESHOLD_": "1048576"})
    assert not malloc_thresholds_move({"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1073741824"})
    assert malloc_thresholds_move({"GLIBC_TUNABLES": "glibc.malloc.tcache_count=0"}) is on_glibc


def test_malloc_advice_names_the_settings_only_when_the_thresholds_move() -> None:
    assert malloc_advice(dict(PINNED_MALLOC)) is None
    advice = malloc_advice({})
    if platform.libc_ver()[0] == "glibc":
        assert advice is not None
        assert "MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=4294967296" in advice
    else:
        assert advice is None


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the data segment from /proc")
def test_data_limited_turns_a_runaway_allocation_into_the_allocator_s_out_of_memory() -> None:
    # What a profiled (compiled) trial runs under: the cap is judged after its steps, so a batch
    # far past it must fail as an allocation, not take more memory than the host has free.
    before = resource.getrlimit(resource.RLIMIT_DATA)
    with data_limited(256 * 2**20):
        small = torch.ones(16 * 2**20 // 4)  # 16 MiB: well within the room
        with pytest.raises(RuntimeError) as raised:
            torch.ones(1024 * 2**20 // 4)  # 1 GiB: past it
        assert is_out_of_memory(raised.value), raised.value
        assert resource.getrlimit(resource.RLIMIT_DATA)[0] != before[0]
    assert resource.getrlimit(resource.RLIMIT_DATA) == before
    assert float(small.sum()) == 16 * 2**20 // 4 and torch.ones(1024 * 2**20 // 4).numel() > 0

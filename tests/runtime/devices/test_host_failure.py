"""A memory_limit on the CPU is a device of that size, which the host must be able to give: a
search whose budget the host cannot give is refused, and the host's own allocator failing in a
trial stops the search saying the machine ran out, never read as the budget's out-of-memory.

The host is made small for real: RLIMIT_AS in a subprocess (host_limit_child.py).
"""

from __future__ import annotations

import errno
import json
import os
import platform
import re
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import batchfit
from batchfit.errors import HostOutOfMemoryError
from batchfit.runtime.devices.device import CappedCpuDevice, CpuDevice
from batchfit.runtime.devices.host import HostMemory, _cgroup_headroom, _status_bytes, host_available_bytes
from batchfit.runtime.devices.oom import is_host_out_of_memory, is_out_of_memory
from batchfit.units import format_bytes

CHILD = Path(__file__).with_name("host_limit_child.py")
MiB = 2**20
HEADROOM_MIB = 128

linux_glibc = pytest.mark.skipif(
    not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
    reason="needs Linux (RLIMIT_AS, /proc/self/status) with glibc (MALLOC_MMAP_THRESHOLD_)",
)


def run_child(*args: str) -> dict[str, Any]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("MALLOC_")}
    env.pop("GLIBC_TUNABLES", None)
    # As test_rlimit.py runs its child: one thread and one malloc arena (no worker stacks or arenas
    # in the address space), a fixed mmap threshold (freed tensors give their address space back,
    # so the same trials run on every run), and no GPU.
    env.update(
        {
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
            "MALLOC_ARENA_MAX": "1",
            "MALLOC_MMAP_THRESHOLD_": str(MiB),
            "CUDA_VISIBLE_DEVICES": "",
        }
    )
    process = subprocess.run(
        [sys.executable, str(CHILD), str(HEADROOM_MIB), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=CHILD.parent,
        timeout=300,
    )
    assert process.returncode == 0, process.stderr
    lines = process.stdout.strip().splitlines()
    assert len(lines) == 1, process.stdout
    report: dict[str, Any] = json.loads(lines[-1])
    return report


def figure(text: str) -> int:
    """Bytes from ``format_bytes``'s rendering (``125.99 MiB``), to its rounding."""
    value, unit = text.split()
    return round(float(value) * {"B": 1, "KiB": 2**10, "MiB": MiB, "GiB": 2**30}[unit])


@linux_glibc
def test_a_search_whose_budget_the_host_cannot_give_is_refused_up_front() -> None:
    # A 64 GiB device on a host with 128 MiB to give: no trial runs, and the error says what the
    # host has, why that matters and what to pass.
    report = run_child("find", "64GiB", "0.8", "100000")
    error = report["error"]
    assert report["started"] == []
    assert (error["type"], error["batchfit_error"]) == ("ConfigurationError", True)
    pattern = (
        r"memory_limit=64\.00 GiB at memory_fraction=0\.8 lets the search's trials take 51\.20 GiB, "
        r"but this host can give them (?P<room>[\d.]+ MiB) \(the least of free RAM [\d.]+ GiB and "
        r"RLIMIT_AS's room (?P<rlimit>[\d.]+ MiB), beside the 2\.00 MiB the workload holds already\): "
        r"past that the host's own allocator fails before the budget does, and the answer would be "
        r"this machine's, not a 64\.00 GiB device's\. Pass memory_limit='(?P<most>\d+)MiB' or less, "
        r"or run where more memory is free \(a cgroup's limit and ulimit -v count too\)\."
    )
    match = re.fullmatch(pattern, error["message"])
    assert match is not None, error["message"]
    room, rlimit = figure(match["room"]), figure(match["rlimit"])
    # The room is the address space left under the limit (less what torch mapped since it was
    # set) beside the parameters the workload holds: 2 MiB of the Wide model's.
    assert HEADROOM_MIB * MiB - 8 * MiB < rlimit <= HEADROOM_MIB * MiB
    assert abs(room - (rlimit + report["parameter_bytes"])) <= 0.01 * MiB
    assert int(match["most"]) in (int(room / 0.8) // MiB - 1, int(room / 0.8) // MiB)


@linux_glibc
def test_a_check_of_one_batch_size_runs_where_its_peak_fits_the_host() -> None:
    # One batch size needs only its own peak (26 MiB here), which the host gives: check answers
    # for the 64 GiB device it was asked about.
    report = run_child("check", "64GiB", "4")
    assert "error" not in report, report
    assert report["answer"]["fits"] is True
    assert report["answer"]["budget_bytes"] == int(0.8 * 64 * 2**30)
    assert 20 * MiB < report["answer"]["peak_bytes"] < HEADROOM_MIB * MiB


def ran_out_pattern(error: dict[str, Any]) -> str:
    """The full text of the error a search stops with where the host ran out, its figures in."""
    attributes = error["attributes"]
    host = re.escape(format_bytes(attributes["host_bytes"]))
    return (
        rf"the host ran out of memory at batch_size={attributes['batch_size']} \(train step [12] of 2\): "
        rf"RuntimeError: {re.escape(error['cause'])}\. That is this machine's own allocator failing, "
        rf"not the 120\.00 MiB budget on cpu \(capped at 120\.00 MiB\): the host could give the "
        rf"trials {host} when they began \(the least of free RAM [\d.]+ GiB and RLIMIT_AS's room "
        rf"{host}\), and what a step takes outside the budget \(its host batch, the allocator's own "
        rf"overhead\) comes from there too\. The search stops, as an answer read from this failure "
        rf"would be the machine's, not the budget's\. Lower memory_limit or memory_fraction so that "
        rf"the budget sits well inside what the host can give, or run on a machine with more memory\."
    )


@linux_glibc
def test_the_host_running_out_mid_search_stops_it_saying_the_machine_ran_out() -> None:
    # A 120 MiB device on a host with about 126 MiB to give: the budget fits the host, but a step
    # takes more than its tracked tensors (its host batch, the allocator's overhead), and the
    # first real trial (22, here) fails in the host's allocator. Read as the budget's
    # out-of-memory it made the search answer 20 from the misread failures; it stops there.
    report = run_child("find", "120MiB", "1.0", "100000")
    error = report["error"]
    assert (error["type"], error["memory_error"], error["batchfit_error"]) == (
        "HostOutOfMemoryError",
        True,
        True,
    )
    attributes = error["attributes"]
    assert report["started"][-1] == attributes["batch_size"]  # the trial that ran out was the last
    assert attributes["budget_bytes"] == 120 * MiB
    assert HEADROOM_MIB * MiB - 8 * MiB < attributes["host_bytes"] <= HEADROOM_MIB * MiB
    assert re.fullmatch(
        r"\[enforce fail at alloc_cpu\.cpp:\d+\] err == 0\. DefaultCPUAllocator: can't allocate memory: "
        r"you tried to allocate \d+ bytes\. Error code 12 \(Cannot allocate memory\)",
        error["cause"],
    ), error["cause"]
    assert re.fullmatch(ran_out_pattern(error), error["message"]), error["message"]


@linux_glibc
def test_the_noise_scale_under_a_memory_limit_says_the_machine_ran_out_not_to_shrink_micro_batches() -> None:
    # Its steps under the cap (120 MiB, micro-batches of 22) run the host out as find's first trial
    # does; read as the budget's, the advice was a smaller micro_batch_size.
    report = run_child("noise", "120MiB", "44", "22")
    error = report["error"]
    assert (error["type"], error["attributes"]["batch_size"]) == ("HostOutOfMemoryError", 22)
    assert error["message"].startswith(
        "the host ran out of memory at batch_size=22 (a micro-batch of the noise scale's step): "
        "RuntimeError: "
    )
    assert error["message"].endswith(
        "Lower memory_limit or memory_fraction so that the budget sits well inside what the host can give, "
        "or run on a machine with more memory."
    )


@linux_glibc
def test_the_command_line_says_the_machine_ran_out_in_one_message_and_exits_1() -> None:
    report = run_child(
        "cli",
        *("find", "--workload", "host_limit_child:workload", "--device", "cpu"),
        *("--memory-limit", "120MiB", "--memory-fraction", "1.0"),
    )
    answer = report["answer"]
    assert answer["exit_code"] == 1
    lines = answer["stderr"].splitlines()
    assert lines[-1] == "(set BATCHFIT_DEBUG=1 to see the traceback)"
    assert len(lines) == 2 and lines[0].startswith(
        "batchfit: error: the host ran out of memory at batch_size="
    )
    assert "That is this machine's own allocator failing, not the 120.00 MiB budget" in lines[0]


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the data segment from /proc")
@pytest.mark.parametrize("device", [CpuDevice(), CappedCpuDevice(2**30)], ids=["cpu", "capped cpu"])
def test_a_cpu_trial_s_data_segment_may_grow_by_what_the_host_has_free(device: CpuDevice) -> None:
    # So that past a cgroup's limit (in host_available_bytes) an allocation fails in the host's
    # allocator, which the search reads, instead of the kernel killing the process.
    before = resource.getrlimit(resource.RLIMIT_DATA)
    if before[0] != resource.RLIM_INFINITY:
        pytest.skip("a data-segment limit of the caller's own is kept")
    with device.measure([]):
        limit = resource.getrlimit(resource.RLIMIT_DATA)[0]
        data, room = _status_bytes("VmData:"), host_available_bytes()
    assert resource.getrlimit(resource.RLIMIT_DATA) == before
    assert data is not None and abs(limit - (data + room)) < 64 * MiB  # free RAM moves meanwhile


def test_host_out_of_memory_is_told_from_the_cap_s_and_from_other_errors() -> None:
    with pytest.raises(RuntimeError) as allocator:
        torch.empty(2**60, dtype=torch.uint8)  # the CPU allocator's own failure
    with pytest.raises(MemoryError) as python:
        bytearray(2**62)
    with pytest.raises(torch.OutOfMemoryError) as cap, batchfit.cap_memory("1MiB"):
        torch.empty(2**20)
    assert is_host_out_of_memory(allocator.value) and is_out_of_memory(allocator.value)
    assert is_host_out_of_memory(python.value)
    assert is_host_out_of_memory(OSError(errno.ENOMEM, os.strerror(errno.ENOMEM)))
    assert is_host_out_of_memory(RuntimeError("std::bad_alloc"))
    # batchfit's cap follows the CPU allocator's message, and is the budget's, not the host's.
    assert is_out_of_memory(cap.value) and not is_host_out_of_memory(cap.value)
    assert not is_host_out_of_memory(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert not is_host_out_of_memory(OSError(errno.ENOENT, "No such file or directory"))
    assert not is_host_out_of_memory(ValueError("cannot allocate memory"))
    assert issubclass(HostOutOfMemoryError, batchfit.BatchfitError)
    assert issubclass(HostOutOfMemoryError, MemoryError)


def write(path: Path, text: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    for line in text.split(";"):
        name, _, value = line.partition("=")
        (path / name.strip()).write_text(value.strip())


@pytest.mark.parametrize(
    ("membership", "files", "room"),
    [
        # v2: the process's own cgroup and its ancestors' limits; the least room wins.
        (
            "0::/job/step\n",
            {"job": "memory.max=1000;memory.current=400", "job/step": "memory.max=max;memory.current=300"},
            600,
        ),
        (
            "0::/job/step\n",
            {"job": "memory.max=1000;memory.current=400", "job/step": "memory.max=500;memory.current=300"},
            200,
        ),
        # v1's memory controller, among the others.
        (
            "5:cpu:/a\n4:memory:/a/b\n",
            {"memory/a/b": "memory.limit_in_bytes=800;memory.usage_in_bytes=100"},
            700,
        ),
        # In a cgroup namespace the process's own is the mount; v1's "no limit" is a huge number.
        ("0::/\n", {"": "memory.max=2048;memory.current=48"}, 2000),
        ("4:memory:/\n", {"memory": f"memory.limit_in_bytes={2**63 - 4096};memory.usage_in_bytes=5"}, None),
        ("0::/job\n", {"job": "memory.max=max;memory.current=1"}, None),
    ],
)
def test_the_cgroup_room_is_the_least_its_limits_and_its_ancestors_leave(
    tmp_path: Path, membership: str, files: dict[str, str], room: int | None
) -> None:
    for folder, text in files.items():
        write(tmp_path / folder, text)
    assert _cgroup_headroom(str(tmp_path), membership) == room


def test_host_memory_names_where_its_figure_comes_from() -> None:
    both = HostMemory(free_ram_bytes=20 * 2**30, cgroup_room_bytes=None, rlimit_room_bytes=100 * MiB)
    assert (both.available_bytes, both.describe()) == (
        100 * MiB,
        "the least of free RAM 20.00 GiB and RLIMIT_AS's room 100.00 MiB",
    )
    three = HostMemory(free_ram_bytes=3 * 2**30, cgroup_room_bytes=2 * 2**30, rlimit_room_bytes=-5)
    assert (three.available_bytes, three.describe()) == (
        0,
        "the least of free RAM 3.00 GiB, the cgroup's room 2.00 GiB and RLIMIT_AS's room 0 B",
    )
    assert HostMemory(2**30, None, None).describe() == "free RAM 1.00 GiB"

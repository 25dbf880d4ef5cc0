"""A search under a real OS memory limit: RLIMIT_AS in a subprocess, no batchfit cap_memory.

The CPU allocator itself fails (``DefaultCPUAllocator: can't allocate memory``) on batches that
are too large; the search must treat that as an out-of-memory trial, back off, and return a batch
that then trains in the same process. The child script is tests/runtime/devices/rlimit_child.py.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

CHILD = Path(__file__).with_name("rlimit_child.py")
MiB = 2**20
ALLOCATOR_FAILURE = "DefaultCPUAllocator: can't allocate memory"

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
    reason="needs Linux (RLIMIT_AS, /proc/self/status) with glibc (MALLOC_MMAP_THRESHOLD_)",
)


def run_child(headroom_mib: int, steps: int, fraction: float, extra_env: dict[str, str]) -> dict[str, Any]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("MALLOC_")}
    env.pop("GLIBC_TUNABLES", None)
    # One thread: no OpenMP/MKL worker stacks in the address space, and stable timings.
    # One malloc arena: each other thread that mallocs reserves a 64 MiB arena of address space
    # (a CUDA build's did: the capacity read 64 MiB short of the headroom on an H100 machine).
    env.update({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "MALLOC_ARENA_MAX": "1", **extra_env})
    # The CPU under RLIMIT_AS: no GPU. (A CUDA build's driver and autograd's per-device threads
    # cannot start inside the limit: "Resource temporarily unavailable" on an H100 machine.)
    env["CUDA_VISIBLE_DEVICES"] = ""
    process = subprocess.run(
        [sys.executable, str(CHILD), str(headroom_mib), str(steps), str(fraction)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert process.returncode == 0, process.stderr
    lines = process.stdout.strip().splitlines()
    assert len(lines) == 1, process.stdout
    report: dict[str, Any] = json.loads(lines[0])
    return report


@pytest.mark.parametrize(
    ("extra_env", "headroom_mib", "fraction"),
    [
        # A fixed mmap threshold: every tensor of 1 MiB or more is its own mmap, unmapped when freed,
        # so VmSize follows the live tensors and the search leaves no address space behind.
        # memory_fraction=1.0: the budget is the whole headroom, so the model-guided jump overshoots the
        # real limit (the host batch and allocator overhead are not in the tracked peak) and the
        # CPU allocator fails. Deterministic: the same trials on every run.
        pytest.param({"MALLOC_MMAP_THRESHOLD_": str(MiB)}, 128, 1.0, id="fixed-mmap-threshold"),
        # glibc's defaults and batchfit's default fraction. Tensors below the dynamic mmap
        # threshold (up to 32 MiB) come from the brk heap, which keeps its address space when
        # they are freed: VmSize reaches ~2.5x the tracked tensor peak, so real allocator
        # failures, not the budget, bound the search. batchfit runs the answer again after a real
        # failure, but training right after the search (new host batches every step) still fails
        # in some runs: a known limit of counting tensors, not address space (see the README).
        pytest.param(
            {},
            256,
            0.8,
            id="glibc-defaults",
            marks=[
                pytest.mark.slow,
                pytest.mark.xfail(reason="heap address space is not counted", strict=False),
            ],
        ),
    ],
)
def test_search_under_rlimit_as_survives_allocator_failures_and_its_answer_trains(
    extra_env: dict[str, str], headroom_mib: int, fraction: float
) -> None:
    steps = 4
    report = run_child(headroom_mib, steps, fraction, extra_env)
    result, trials = report["result"], report["result"]["trials"]
    outcomes = [(trial["batch_size"], trial["outcome"]) for trial in trials]

    # The limit is in place and real: twice the headroom cannot be allocated.
    assert report["rlimit_as"] == report["vm_before"] + headroom_mib * MiB
    assert ALLOCATOR_FAILURE in report["probe"]
    # With no memory_limit, the CPU capacity is the RLIMIT_AS headroom (plus the parameters it
    # already holds), not the machine's RAM.
    assert result["device"] == "cpu"
    assert (
        headroom_mib * MiB // 2 < result["capacity_bytes"] <= (headroom_mib * MiB + report["parameter_bytes"])
    )
    assert result["budget_bytes"] == int(fraction * result["capacity_bytes"])

    # The CPU allocator itself failed during the search, and the search carried on.
    failures = [trial for trial in trials if trial["outcome"] == "oom"]
    assert failures, f"no trial hit the real limit: {outcomes}"
    for trial in failures:
        assert ALLOCATOR_FAILURE in trial["detail"] or trial["detail"].startswith("MemoryError"), trial
        assert trial["step_seconds"] is None

    # The answer was measured to fit (last: after a real failure it is run again, since a failed
    # trial can leave the heap larger), and the next batch size really failed.
    answer = [trial for trial in trials if trial["batch_size"] == result["batch_size"]]
    assert answer[-1]["outcome"] == "ok", outcomes
    assert answer[-1]["peak_bytes"] == result["peak_bytes"] <= result["budget_bytes"]
    if len(failures) > 0:
        assert len(answer) >= 2, f"the answer was not checked again after a real failure: {outcomes}"
    assert result["batch_size"] >= 2, outcomes
    assert result["stop_reason"] == "boundary", outcomes
    following = [trial for trial in trials if trial["batch_size"] == result["batch_size"] + 1]
    assert following and following[-1]["outcome"] != "ok", outcomes

    # Training at the answer, right after the search, in the same process: every step runs.
    assert report["train_error"] is None, (
        f"training at batch_size={result['batch_size']} failed after the search: {report['train_error']}; "
        f"trials {outcomes}; VmSize grew by {(report['vm_after_search'] - report['vm_before']) / MiB:.0f} "
        f"MiB of the {headroom_mib} MiB headroom during the search"
    )
    assert len(report["losses"]) == steps
    assert report["losses_finite"]
    assert report["parameters_changed"]

"""Out-of-memory recognition: by type, then by every backend's message; nothing else."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from batchfit.runtime.devices.oom import fragmented, is_out_of_memory

MiB = 1 << 20


@pytest.mark.parametrize(
    "error",
    [
        torch.OutOfMemoryError("anything"),
        MemoryError(),
        RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.15 GiB total capacity)"),
        RuntimeError("HIP out of memory. Tried to allocate 20.00 MiB"),
        RuntimeError("XPU out of memory. Tried to allocate 1.00 GiB"),
        RuntimeError("MPS backend out of memory (MPS allocated: 17.00 GB, other allocations: 1.00 GB)"),
        RuntimeError("CUDA error: out of memory"),
        RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED"),
        RuntimeError("FIND was unable to find an engine to execute this computation"),
        RuntimeError("GET was unable to find an engine to execute this computation"),
        RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"),
        RuntimeError(
            "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED. This error may appear if you passed in a "
            "non-contiguous input."
        ),
        RuntimeError(
            "[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate memory: "
            "you tried to allocate 4294967296 bytes. Error code 12 (Cannot allocate memory)"
        ),
    ],
)
def test_recognised(error: BaseException) -> None:
    assert is_out_of_memory(error)


@pytest.mark.parametrize(
    "error",
    [
        RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x3 and 4x5)"),
        ValueError("out of memory"),  # not an allocation failure type
        KeyboardInterrupt(),
        RuntimeError("CUDA error: device-side assert triggered"),
        TypeError("forward() missing 1 required positional argument"),
    ],
)
def test_not_recognised(error: BaseException) -> None:
    assert not is_out_of_memory(error)


H100_CURVES = (
    Path(__file__).resolve().parents[3]
    / "bench"
    / "data"
    / "h100-2026-11-25"
    / "find-curves-cuda-cnn-transformer.json"
)


def _h100_failure(workload: str, batch_size: int, kind: str) -> str:
    """The message of a trial that ran out of memory on the H100 (2026-11-25), as recorded."""
    curves = json.loads(H100_CURVES.read_text())["curves"]
    (curve,) = [curve for curve in curves if curve["workload"] == workload]
    (point,) = [point for point in curve["points"] if point["batch_size"] == batch_size]
    return str(point[kind]["detail"])


def test_cuda_s_message_says_where_the_cache_had_room_in_pieces() -> None:
    # The cnn's 156 asked for 40 MiB with 84.65 MiB of its cache free: fragmentation. Its 256
    # asked for 32 MiB with 643.5 KiB free: the cap itself.
    assert fragmented(_h100_failure("cnn", 156, "long")) == (40 * MiB, round(84.65 * MiB))
    assert fragmented(_h100_failure("cnn", 256, "short")) is None
    assert fragmented("CUDA out of memory. Tried to allocate 2.00 GiB") is None  # says nothing of the cache
    assert fragmented(
        "Tried to allocate 512 bytes. ... and 1.00 KiB is reserved by PyTorch but unallocated."
    ) == (
        512,
        1024,
    )

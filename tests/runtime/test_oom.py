"""Out-of-memory recognition: by type, then by every backend's message; nothing else."""

from __future__ import annotations

import pytest
import torch

from batchfit import is_out_of_memory


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

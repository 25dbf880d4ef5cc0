"""Recognise an out-of-memory failure, on any backend, from the exception alone."""

from __future__ import annotations

import errno
import re

import torch

# Substrings of the messages that backends raise when an allocation fails. Lower-cased.
OOM_MESSAGES: tuple[str, ...] = (
    "out of memory",  # CUDA, HIP/ROCm, XPU, MPS ("MPS backend out of memory"), batchfit's cap
    "defaultcpuallocator: can't allocate memory",  # the CPU allocator
    "cudnn_status_alloc_failed",
    "cublas_status_alloc_failed",
    "cusolver_status_alloc_failed",
    "cufft_alloc_failed",
    "hipblas_status_alloc_failed",
    "miopen_status_alloc_failed",
    "failed to allocate memory",
    # cuDNN reports some allocation failures as NOT_SUPPORTED (accelerate treats it the same way).
    "cudnn_status_not_supported. this error may appear if you passed in a non-contiguous input",
    # cuDNN's frontend when no engine's workspace can be allocated (pytorch/pytorch#108645): under
    # a cap with cudnn.benchmark on, in the backward of a batch whose first steps fit.
    "was unable to find an engine to execute this computation",
)


def is_out_of_memory(error: BaseException) -> bool:
    """True when ``error`` is an allocation failure: by type first, then by message.

    Anything else (a shape error, a bug in the model, Ctrl-C) is not an out-of-memory and the
    caller must let it propagate.
    """
    if isinstance(error, (torch.OutOfMemoryError, MemoryError)):
        return True
    if not isinstance(error, RuntimeError):
        return False
    message = str(error).lower()
    return any(fragment in message for fragment in OOM_MESSAGES)


#: Fragments of the messages of the host's own allocator failing (lower-cased): torch's CPU
#: allocator, errno 12's text, C++'s ``std::bad_alloc``.
HOST_MESSAGES: tuple[str, ...] = (
    "defaultcpuallocator: can't allocate memory",
    "cannot allocate memory",
    "bad_alloc",
)
#: How batchfit's own cap ends its out-of-memory messages (``runtime.devices.tracker``), which
#: follow the CPU allocator's so that tools matching on it recognise them.
CAP_MARK = "set by batchfit"


def is_host_out_of_memory(error: BaseException) -> bool:
    """True when ``error`` is the host's own allocator failing: Python's ``MemoryError``, an
    ``OSError`` of errno ENOMEM, or torch's CPU allocator or C++'s ``std::bad_alloc`` in a
    ``RuntimeError``; not batchfit's cap, whose messages follow the CPU allocator's."""
    if isinstance(error, MemoryError):
        return True
    if isinstance(error, OSError):
        return error.errno == errno.ENOMEM
    if not isinstance(error, RuntimeError):
        return False
    message = str(error).lower()
    return CAP_MARK not in message and any(fragment in message for fragment in HOST_MESSAGES)


def first_line(error: BaseException) -> str:
    """``Type: first line of the message``: a CUDA out-of-memory's message runs over many lines."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}".rstrip(": ")


_SIZE = r"([\d.]+) (bytes|B|KiB|MiB|GiB|TiB)"
_UNITS = {"bytes": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}


def fragmented(message: str) -> tuple[int, int] | None:
    """From a CUDA out-of-memory message (or the modelled allocator's, in the same phrases): what the
    allocator tried to allocate and what it held reserved but unallocated, where the second is the
    larger: the cache had room, not in one piece (fragmentation). None otherwise, or where the
    message does not say."""
    tried = re.search(r"Tried to allocate " + _SIZE, message)
    free = re.search(_SIZE + r" is reserved by PyTorch but unallocated", message)
    if tried is None or free is None:
        return None
    asked, held = (round(float(match[1]) * _UNITS[match[2]]) for match in (tried, free))
    return (asked, held) if held >= asked else None

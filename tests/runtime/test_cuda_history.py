"""Reading CUDA's allocator history into a recording: the parser, on histories written as
``torch.cuda.memory._snapshot()`` documents its trace entries (the recording on a real GPU is
checked by tests/test_gpu.py under the ``gpu`` marker)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from batchfit.policy.allocation_replay import ALLOC, FREE, AllocationRecord, Recording
from batchfit.runtime.cuda import _CudaAllocator, read_trace


def entry(action: str, addr: int | None = None, size: int = 0) -> dict[str, Any]:
    fields: dict[str, Any] = {"action": action, "size": size, "stream": 0, "frames": []}
    if addr is not None:
        fields["addr"] = addr
    return fields


HISTORY = [
    entry("segment_alloc", 0x1000, 2 << 20),  # the allocator's own: not a request
    entry("alloc", 0x1000, 1024),
    entry("alloc", 0x1400, 512),
    entry("free_requested", 0x1000, 1024),  # the block is back in the pool at free_completed
    entry("free_completed", 0x1000, 1024),
    entry("alloc", 0x1000, 512),  # the same address, another request
    entry("free_completed", 0x1400, 512),
    entry("free_completed", 0x1000, 512),
    entry("free_completed", 0x9000, 512),  # made before the recording
    entry("snapshot"),
]


def test_each_alloc_is_a_request_and_each_completed_free_its_free_by_address() -> None:
    recording = Recording((((2 << 20, False),),))
    read_trace(HISTORY[:8], [1, 5], recording)
    assert recording.record(4) == AllocationRecord(
        4,
        (((2 << 20, False),),),
        ((), ((ALLOC, 1024), (ALLOC, 512), (FREE, 0)), ((ALLOC, 512), (FREE, 1), (FREE, 2))),
    )


def test_a_free_of_a_block_made_before_or_a_history_that_overflowed_spoils_the_record() -> None:
    recording = Recording(())
    read_trace(HISTORY, [1], recording)
    assert recording.record(4) is None
    recording = Recording(())
    read_trace(HISTORY[:8], [1], recording, max_entries=8)
    assert recording.record(4) is None


def test_steps_marked_after_the_last_entry_are_empty_steps() -> None:
    recording = Recording(())
    read_trace(HISTORY[1:3], [0, 2, 2], recording)
    record = recording.record(2)
    assert record is not None and record.steps == ((), ((ALLOC, 1024), (ALLOC, 512)), (), ())


def test_a_torch_without_the_allocator_history_records_nothing_and_raises_nothing() -> None:
    # This CPU-only build has torch.cuda.memory._record_memory_history but not its C++ half (and
    # a CUDA build without a driver raises asking for the allocator's backend): the CUDA device's
    # recording is then None, and find runs without the forecast.
    if torch.cuda.is_available():
        pytest.skip("a CUDA build: tests/test_gpu.py checks the recording there")
    with _CudaAllocator(torch.device("cuda", 0)).recording() as recording:
        assert recording is None

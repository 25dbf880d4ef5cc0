"""Reading CUDA's allocator into the model: its history into a recording, on histories written as
``torch.cuda.memory._snapshot()`` documents its trace entries; its segments into the state a
trial starts from, on snapshots written as ``torch.cuda.memory_snapshot()`` documents them; no
record under settings the model does not have (the recording on a real GPU is checked by
tests/test_gpu.py under the ``gpu`` marker)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from batchfit.policy.allocator.allocation_record import ALLOC, FREE, AllocationRecord, Recording
from batchfit.policy.allocator.caching_allocator import CachingAllocator
from batchfit.runtime.devices.cuda import _CudaAllocator
from batchfit.runtime.devices.cuda_history import allocator_start, read_trace


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


def segment(
    address: int,
    blocks: list[tuple[int, str]],
    kind: str = "large",
    expandable: bool = False,
    stream: int = 0,
) -> dict[str, Any]:
    """A segment of ``torch.cuda.memory_snapshot()``, as torch documents it."""
    return {
        "device": 0,
        "address": address,
        "total_size": sum(size for size, _ in blocks),
        "stream": stream,
        "segment_type": kind,
        "is_expandable": expandable,
        "blocks": [{"size": size, "state": state} for size, state in blocks],
    }


MiB = 1 << 20
USED, FREE_BLOCK = "active_allocated", "inactive"


def test_a_snapshot_of_segments_is_the_model_s_start() -> None:
    snapshot = [
        segment(0x40000000, [(20 * MiB, FREE_BLOCK)]),
        segment(0x10000000, [(MiB, USED), (MiB, FREE_BLOCK)], "small"),
        segment(0x20000000, [(4 * MiB, USED), (16 * MiB, FREE_BLOCK)]),
        segment(0x20000000, [(2 * MiB, USED)], "small") | {"device": 1},  # another device's
    ]
    assert allocator_start(snapshot, 0, expandable=False) == (
        (((MiB, True), (MiB, False)), ((4 * MiB, True), (16 * MiB, False)), ((20 * MiB, False),)),
        False,
    )


def test_an_expandable_segment_s_mapped_stretches_are_one_segment_with_the_unmapped_space_between() -> None:
    base = 0x7F0000000000
    snapshot = [
        segment(base, [(30 * MiB, USED), (10 * MiB, FREE_BLOCK)], expandable=True),
        segment(base + 60 * MiB, [(20 * MiB, USED)], expandable=True),  # 20 MiB unmapped before it
        segment(0x7E0000000000, [(KiB := 1024, USED), (2 * MiB - KiB, FREE_BLOCK)], "small", expandable=True),
    ]
    start = allocator_start(snapshot, 0, expandable=True)
    large = ((30 * MiB, True), (10 * MiB, False), (20 * MiB, None), (20 * MiB, True))
    assert start == ((((KiB, True), (2 * MiB - KiB, False)), large), True)
    # The model starts from it: a request that the free 10 MiB and the hole hold maps the hole.
    allocator = CachingAllocator.starting_from(start[0], expandable=True)
    assert allocator.reserved_bytes == 62 * MiB
    allocator.malloc(25 * MiB)
    assert allocator.reserved_bytes == 82 * MiB and allocator.segments()[1][1] == (25 * MiB, True)


def test_a_start_the_model_cannot_take_is_none() -> None:
    native, expandable = segment(0, [(20 * MiB, USED)]), segment(1 << 40, [(20 * MiB, USED)], expandable=True)
    assert (
        allocator_start([native, expandable], 0, expandable=True) is None
    )  # made before the setting changed
    assert allocator_start([native], 0, expandable=True) is None
    assert allocator_start([expandable], 0, expandable=False) is None
    on_another_stream = segment(1 << 41, [(20 * MiB, USED)], expandable=True, stream=7)
    assert allocator_start([expandable, on_another_stream], 0, expandable=True) is None
    assert allocator_start([], 0, expandable=True) == (((), ()), True)  # nothing mapped yet


def test_under_settings_the_model_does_not_have_the_cuda_device_takes_no_record(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Set after torch read its own (none here): batchfit reads the environment then, as on a torch
    # without its own account. The record is refused before any CUDA call.
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:128")
    allocator = _CudaAllocator(torch.device("cuda", 0))
    with caplog.at_level("DEBUG", logger="batchfit.runtime.devices.cuda"), allocator.recording() as recording:
        assert recording is None
    assert "does not have max_split_size_mb:128" in caplog.text


def test_the_record_places_a_segment_the_trial_took_below_the_start_s_where_cuda_did() -> None:
    # HISTORY's segment lies at 0x1000, below a start's segment at 0x100000: ranked 1, then 0.
    recording = Recording((((2 << 20, False),),))
    read_trace(HISTORY[:8], [1, 5], recording, bases=[0x100000])
    record = recording.record(4)
    assert record is not None and record.places == (1, 0)
    assert AllocationRecord.from_dict(record.to_dict()) == record
    # A segment given back during the trial may come back anywhere: no places.
    recording = Recording((((2 << 20, False),),))
    read_trace([*HISTORY[:8], entry("segment_free", 0x1000, 2 << 20)], [1, 5], recording, bases=[0x100000])
    record = recording.record(4)
    assert record is not None and record.places == ()

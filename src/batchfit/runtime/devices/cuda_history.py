"""Torch's own CUDA allocator history, read into a ``Recording``: whether batchfit may turn it on,
the allocator's start state from a ``memory_snapshot()``, and the history's events fed to the
record a trial replays (``policy.allocator``)."""

from __future__ import annotations

import logging
from typing import Any

import torch

from batchfit.policy.allocator.allocation_record import Recording, ranked
from batchfit.policy.allocator.allocator_blocks import Segments

logger = logging.getLogger(__name__)

#: The most allocator events a recorded trial keeps (torch's history is a ring: past this, the
#: oldest are dropped, and a recording that lost any is not used).
MAX_TRACE_ENTRIES = 1_000_000


def history_free() -> bool:
    """Whether this torch keeps an allocator history that batchfit can turn on and read, and nobody
    records one now."""
    memory = torch.cuda.memory
    enabled = getattr(torch._C, "_cuda_isHistoryEnabled", None)  # absent from CPU-only builds too
    if enabled is None or not (hasattr(memory, "_record_memory_history") and hasattr(memory, "_snapshot")):
        return False
    try:  # a CUDA build on a machine without a driver raises here (torch.AcceleratorError)
        backend = getattr(memory, "get_allocator_backend", lambda: "native")()
        return backend == "native" and not enabled()
    except RuntimeError as error:
        logger.debug("no allocator history: %s", error)
        return False


class HistoryRecording(Recording):
    """A ``Recording`` read from the allocator's history at the end; a step's mark notes where in
    the history it begins (``begin``: where the history stood when it was turned on)."""

    def __init__(self, start: Segments, expandable: bool, index: int) -> None:
        super().__init__(start, expandable)
        self.index = index
        self.begin = len(history(index))
        self.starts: list[int] = []

    def mark_step(self) -> None:
        self.starts.append(len(history(self.index)))


def history(index: int) -> list[Any]:
    traces = torch.cuda.memory._snapshot().get("device_traces", [])
    return list(traces[index]) if index < len(traces) else []


def read_trace(
    entries: list[Any],
    step_starts: list[int],
    recording: Recording,
    max_entries: int = MAX_TRACE_ENTRIES,
    bases: list[int] | None = None,
) -> None:
    """Feed a CUDA allocator history (``_snapshot()["device_traces"][i]``) to ``recording``: each
    ``alloc`` a request, each ``free_completed`` (the block back in the pool) its free, a step begun
    at each of ``step_starts``. A history that reached ``max_entries`` lost its oldest events: the
    recording is marked incomplete. ``bases``: the addresses of the segments the recording started
    from, in address order (None: not known, or expandable); with them, the recording's ``places``
    rank those and each ``segment_alloc``'s by address, where no ``segment_free`` came between."""
    if len(entries) >= max_entries:
        recording.complete = False
    ordinals: dict[int, int] = {}  # address -> the ordinal of the request that holds it
    starts = sorted(step_starts)
    for position, entry in enumerate(entries):
        while starts and starts[0] <= position:
            starts.pop(0)
            recording.next_step()
        action, address = entry.get("action"), entry.get("addr")
        if action == "alloc" and address is not None:
            ordinals[address] = recording.alloc(int(entry.get("size", 0)))
        elif action == "free_completed" and address is not None:
            recording.free(ordinals.pop(address, None))
    for _ in starts:
        recording.next_step()
    actions = [entry.get("action") for entry in entries]
    if bases is not None and "segment_free" not in actions:
        made = [int(entry["addr"]) for entry in entries if entry.get("action") == "segment_alloc"]
        recording.places = ranked([*bases, *made])


def allocator_start(snapshot: Any, index: int | None, expandable: bool) -> tuple[Segments, bool] | None:
    """The state of device ``index``'s allocator in a ``memory_snapshot()``, as
    ``policy.allocator.caching_allocator`` lists it, and whether its segments are expandable (``expandable``:
    the allocator makes expandable segments now); None where the model cannot start from it:
    segments of both kinds, or expandable ones on several streams.

    Each segment's blocks: their sizes and whether in use, in address order. The snapshot lists an
    expandable segment as its mapped stretches; the unmapped space between two is taken from their
    addresses (any before the first is not seen: the model starts at that stretch)."""
    segments = device_segments(snapshot, index)
    kinds = {bool(segment.get("is_expandable", False)) for segment in segments}
    if kinds and kinds != {expandable}:
        return None  # made before the setting changed: the model has one kind at a time
    if not expandable:
        return tuple(_states(segment) for segment in segments), False
    if len({segment["stream"] for segment in segments}) > 1:
        return None  # an expandable segment a stream: the model has one
    pools = []
    for small in (True, False):
        blocks: list[tuple[int, bool | None]] = []
        end = None
        for segment in segments:
            if (segment["segment_type"] == "small") != small:
                continue
            if end is not None and segment["address"] > end:
                blocks.append((int(segment["address"] - end), None))
            blocks.extend(_states(segment))
            end = segment["address"] + segment["total_size"]
        pools.append(tuple(blocks))
    return tuple(pools), True


def _states(segment: Any) -> tuple[tuple[int, bool | None], ...]:
    return tuple((int(b["size"]), b["state"] != "inactive") for b in segment["blocks"])


def device_segments(snapshot: Any, index: int | None) -> list[Any]:
    """The segments of device ``index`` in a ``memory_snapshot()``, in address order."""
    return sorted((s for s in snapshot if s.get("device") == index), key=lambda s: s["address"])

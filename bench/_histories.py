"""CUDA's allocator histories (``bench/allocator_history.py``'s files) read back against batchfit's
model of the allocator: the state each trial started from, its requests replayed on the model
(``policy.allocator.caching_allocator``) beside the segments CUDA took, and its requests as the
``AllocationRecord`` that ``predict``'s replay plays.

The start is seeded from the trial itself. A trace begins after the resident state was made (the
parameters, the buffers, cuBLAS's workspaces) and the cache was emptied, so every segment at the end
that no ``segment_alloc`` of the trace made held that state when the trace began; none of the
recorded traces frees a block it did not allocate, so within those segments whatever the trace
placed a request in was free at the start, and what it never touched is taken as held. The held
bytes so taken include any free fragment that no request of the trial used (and the remainder of a
large-pool block CUDA left unsplit): the allocated bytes at the start may be over by those, not the
places where requests land.
"""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batchfit.policy.allocator.allocation_record import ALLOC, FREE, AllocationRecord, AllocatorEvent, ranked
from batchfit.policy.allocator.allocator_blocks import (
    LARGE_PAGE,
    SMALL_PAGE,
    SMALL_SEGMENT,
    Block,
    BlockState,
    Segments,
    rounded,
)
from batchfit.policy.allocator.caching_allocator import CachingAllocator

ROOT = Path(__file__).resolve().parents[1]
HISTORIES = ROOT / "bench" / "data" / "h200-2026-11-26-2"
WORKLOADS = ("mlp", "cnn", "transformer", "resnet50", "resnet50-amp", "vit-b16", "gpt2")


@dataclass(frozen=True)
class History:
    """One recorded trial: its trace's events (action, CUDA address, bytes), the segments CUDA held
    at the end (address, bytes) and torch's peak allocated bytes (the resident state included)."""

    workload: str
    batch_size: int
    events: tuple[tuple[str, int, int], ...]
    segments: tuple[tuple[int, int], ...]
    allocated_at_end: tuple[int, ...]  # each segment's allocated bytes at the end, in that order
    peak_allocated_bytes: int

    @classmethod
    def of(cls, workload: str, trial: dict[str, Any]) -> History:
        events = tuple(
            (action, int(address), int(size)) for action, address, size, _ in map(str.split, trial["entries"])
        )
        ordered = sorted(trial["segments_at_end"], key=lambda segment: int(segment["address"]))
        segments = tuple((int(s["address"]), int(s["total_size"])) for s in ordered)
        allocated = tuple(int(segment["allocated_size"]) for segment in ordered)
        return cls(
            workload,
            int(trial["batch_size"]),
            events,
            segments,
            allocated,
            int(trial["peak_allocated_bytes"]),
        )

    @property
    def reserved_bytes(self) -> int:
        """What CUDA reserved at the end (no trace frees a segment: also its peak)."""
        return sum(size for _, size in self.segments)

    @property
    def segment_sizes(self) -> tuple[int, ...]:
        """The segments CUDA took during the trace, in order."""
        return tuple(size for action, _, size in self.events if action == "segment_alloc")

    def step_start(self) -> int:
        """Where the second step begins: the first request after the first request's block (the
        first step's batch, which lives until that step returns) is freed."""
        first = next(address for action, address, _ in self.events if action == "alloc")
        freed = next(
            i for i, (a, address, _) in enumerate(self.events) if a == "free_completed" and address == first
        )
        return next(i for i in range(freed, len(self.events)) if self.events[i][0] == "alloc")


def recorded(directory: Path = HISTORIES) -> list[str]:
    """The recorded allocator histories' files, from the repository's root, as results files name them."""
    return sorted(str(path.relative_to(ROOT)) for path in directory.glob("allocator-*"))


def histories(workload: str, directory: Path = HISTORIES) -> dict[int, History]:
    """The recorded trials of ``workload``, by batch size."""
    data = json.loads((directory / f"allocator-history-cuda-{workload}.json").read_text())
    return {int(trial["batch_size"]): History.of(workload, trial) for trial in data["trials"]}


@dataclass(frozen=True)
class Start:
    """The state a trial began from, as the model lists it: each segment that held the resident
    state (its CUDA address in ``bases``), its untouched stretches held and the rest free."""

    segments: Segments
    bases: tuple[int, ...]

    @property
    def held_bytes(self) -> int:
        return sum(size for blocks in self.segments for size, state in blocks if state)

    @property
    def reserved_bytes(self) -> int:
        return sum(size for blocks in self.segments for size, _ in blocks)


def start_of(history: History) -> Start:
    """The start seeded as the module's docstring says."""
    made = {address for action, address, _ in history.events if action == "segment_alloc"}
    bases = tuple(address for address, _ in history.segments if address not in made)
    every = [address for address, _ in history.segments]
    touched: dict[int, list[tuple[int, int]]] = {base: [] for base in bases}
    held = {base: allocated for base, allocated in zip(every, history.allocated_at_end, strict=True)}
    live: dict[int, int] = {}
    for action, address, size in history.events:
        base = every[bisect.bisect_right(every, address) - 1]
        if action == "alloc":
            live[address] = rounded(size)
            if base in touched:
                touched[base].append((address - base, address - base + rounded(size)))
        elif action == "free_completed":
            live.pop(address)
    for address, size in live.items():  # what the trace left allocated is not the resident state's
        held[every[bisect.bisect_right(every, address) - 1]] -= size
    sizes = dict(history.segments)
    return Start(tuple(_blocks(sizes[base], touched[base], held[base]) for base in bases), bases)


def _blocks(total: int, touched: list[tuple[int, int]], held: int) -> tuple[tuple[int, BlockState], ...]:
    """A segment of ``total`` bytes whose ``touched`` stretches were free and whose untouched ones
    hold ``held`` bytes, the lowest first (the resident tensors were made first, in a segment of
    their own, and a split keeps the front), the rest free."""
    spans: list[tuple[int, int, bool]] = []  # (start, end, touched)
    end = 0
    for low, high in sorted(touched):
        if low > end:
            spans.append((end, low, False))
        if high > end:
            spans.append((max(low, end), high, True))
            end = high
    if end < total:
        spans.append((end, total, False))
    blocks: list[tuple[int, BlockState]] = []
    for low, high, was_touched in spans:
        taken = 0 if was_touched else min(high - low, max(0, held))
        held -= taken
        for size, state in ((taken, True), (high - low - taken, False)):
            if size and blocks and blocks[-1][1] is False and state is False:
                blocks[-1] = (blocks[-1][0] + size, False)
            elif size:
                blocks.append((size, state))
    return tuple(blocks)


@dataclass(frozen=True)
class ModelRun:
    """A trial's requests and frees, in CUDA's order, on the model from the seeded start."""

    segment_sizes: tuple[int, ...]  # the segments the model took, in order
    reserved_bytes: int
    peak_reserved_bytes: int
    peak_allocated_bytes: int
    requests: int
    placed_alike: int  # placed in the same segment, at the same offset, as CUDA placed them
    first_apart: int | None  # the first request placed elsewhere (its ordinal), None: none


def model_run(history: History) -> ModelRun:
    """Replay ``history``'s requests on the model (see ``ModelRun``)."""
    start = start_of(history)
    made = [address for action, address, _ in history.events if action == "segment_alloc"]
    allocator = CachingAllocator.starting_from(start.segments, places=ranked([*start.bases, *made]))
    model_bases = [address for address, _ in allocator.layout()]  # the start's segments, in order
    cuda_bases = list(start.bases)  # CUDA's segments as the model's ordinals number them
    held: dict[int, Block] = {}
    taken: list[int] = []
    alike, first_apart, ordinal = 0, None, 0
    for action, address, size in history.events:
        if action == "segment_alloc":
            cuda_bases.append(address)
        elif action == "free_completed":
            allocator.free(held.pop(address))
        elif action == "alloc":
            before = allocator.reserved_bytes
            block = held[address] = allocator.malloc(size)
            if allocator.reserved_bytes > before:
                taken.append(allocator.reserved_bytes - before)
                model_bases.append(block.address)
            if _place(block, model_bases) == _cuda_place(address, cuda_bases):
                alike += 1
            elif first_apart is None:
                first_apart = ordinal
            ordinal += 1
    return ModelRun(
        tuple(taken), allocator.reserved_bytes, allocator.peak_reserved_bytes,
        allocator.peak_allocated_bytes, ordinal, alike, first_apart,
    )  # fmt: skip


def _place(block: Block, bases: list[int]) -> tuple[int, int]:
    """A model block's segment (its ordinal: the start's first, then in the order taken) and offset."""
    head = block
    while head.prev is not None:
        head = head.prev
    return bases.index(head.address), block.address - head.address


def _cuda_place(address: int, bases: list[int]) -> tuple[int, int]:
    """A CUDA block's segment (the ordinal of the segment it lies in) and offset."""
    ordered = sorted(bases)
    base = ordered[bisect.bisect_right(ordered, address) - 1]
    return bases.index(base), address - base


def record_of(history: History) -> AllocationRecord:
    """``history``'s requests as ``predict`` records a trial: from the seeded start, nothing before
    the first step, each step's requests and frees (a free names its request's ordinal)."""
    split = history.step_start()
    steps: list[list[AllocatorEvent]] = [[], [], []]
    ordinals: dict[int, int] = {}  # address -> the ordinal of the request that holds it
    requests = 0
    for position, (action, address, size) in enumerate(history.events):
        step = steps[1 if position < split else 2]
        if action == "alloc":
            ordinals[address], requests = requests, requests + 1
            step.append((ALLOC, size))
        elif action == "free_completed":
            step.append((FREE, ordinals.pop(address)))
    start = start_of(history)
    made = [address for action, address, _ in history.events if action == "segment_alloc"]
    places = ranked([*start.bases, *made])
    return AllocationRecord(history.batch_size, start.segments, tuple(map(tuple, steps)), places=places)


def expandable_record_of(history: History, gap_bytes: int = 0, held_bytes: int = 0) -> AllocationRecord:
    """``record_of(history)`` on an allocator with expandable segments: the same requests and frees
    (what a step asks for does not depend on the allocator; cuDNN's workspaces aside, which the
    replay has soft), from the resident state of a fresh process. Each pool is one segment that
    holds the start's allocated stretches packed from its beginning, in the start's order, the rest
    of their last page mapped and free, as when the resident tensors are made first and the cache
    is emptied. ``gap_bytes``: a free stretch (mapped) before the large pool's resident state, so
    that it lies that far into its first page, as where a model built anew in a process that ran
    others sits (its place is not recorded). ``held_bytes``: a block more, allocated, after the
    large pool's resident state (what another session's trials held that these lack)."""
    record = record_of(history)
    pools: list[list[tuple[int, BlockState]]] = [[], []]  # the small pool's, the large pool's
    for blocks in record.start:
        small = sum(size for size, _ in blocks) == SMALL_SEGMENT  # only the small pool's are 2 MiB
        pools[0 if small else 1].extend((size, True) for size, state in blocks if state)
    if gap_bytes:
        pools[1].insert(0, (gap_bytes, False))
    if held_bytes:
        pools[1].append((rounded(held_bytes), True))
    for pool, page in zip(pools, (SMALL_PAGE, LARGE_PAGE), strict=True):
        rest = -sum(size for size, _ in pool) % page
        if rest:
            pool.append((rest, False))
    start = tuple(tuple(pool) for pool in pools)
    return AllocationRecord(record.batch_size, start, record.steps, expandable=True)

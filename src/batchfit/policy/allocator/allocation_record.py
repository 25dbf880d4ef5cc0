"""What a trial asked of a caching allocator, request by request: the ``AllocationRecord`` a replay
plays (``policy.allocator.allocation_replay``), and the ``Recording`` a device takes it down with."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from batchfit.policy.allocator.allocator_blocks import Segments

ALLOC, FREE = 0, 1
#: ``(ALLOC, bytes)`` asks for a block; ``(FREE, k)`` gives back the block of the trial's ``k``-th request.
AllocatorEvent = tuple[int, int]


@dataclass(frozen=True)
class AllocationRecord:
    """What one trial asked of a caching allocator: the segments it started from, and its requests
    and frees, step by step (``steps[0]``: what ran before the first step, such as an eval trial's
    training step; often nothing); ``expandable``: the allocator ran with expandable segments;
    ``places``: each segment's rank in address order, the start's and then those the trial took, in
    the order taken (empty where not recorded). The allocator breaks ties between free blocks of one
    size by address, and CUDA places a new segment where the driver finds room, often below the
    start's: the replay places them so (``policy.allocator.allocator_blocks.BlockLists``)."""

    batch_size: int
    start: Segments
    steps: tuple[tuple[AllocatorEvent, ...], ...]
    expandable: bool = False
    places: tuple[int, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def truncated(self, steps: int) -> AllocationRecord:
        """The record of what ran before the steps and the first ``steps`` steps (a confirming
        trial's, to align with an opening trial's: each free names a request made before it)."""
        return replace(self, steps=self.steps[: steps + 1])

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AllocationRecord:
        """The record ``to_dict`` gave (its tuples as JSON's lists)."""
        start = tuple(
            tuple((int(size), None if state is None else bool(state)) for size, state in blocks)
            for blocks in data["start"]
        )
        steps = tuple(tuple((int(kind), int(value)) for kind, value in events) for events in data["steps"])
        places = tuple(int(rank) for rank in data.get("places", ()))
        return cls(int(data["batch_size"]), start, steps, bool(data.get("expandable", False)), places)


def ranked(addresses: list[int]) -> tuple[int, ...]:
    """Each segment's rank in address order (``AllocationRecord.places``), from their addresses in
    the order the record lists them; empty where one repeats (a segment given back and taken again)."""
    if len(set(addresses)) != len(addresses):
        return ()
    ranks = {address: rank for rank, address in enumerate(sorted(addresses))}
    return tuple(ranks[address] for address in addresses)


class Recording:
    """Takes down a trial's requests and frees as an allocator serves them (``mark_step`` between
    steps); ``record`` makes the ``AllocationRecord``, or None where a free named a block the
    recording did not see requested (a resident tensor freed: the trials would not align)."""

    def __init__(self, start: Segments, expandable: bool = False) -> None:
        self.start, self.expandable = start, expandable
        self.steps: list[list[AllocatorEvent]] = [[]]
        self.requests = 0
        self.complete = True
        self.places: tuple[int, ...] = ()  # the segments' order in addresses, where the device says

    def alloc(self, nbytes: int) -> int:
        """Take down a request of ``nbytes``; its ordinal, for ``free``."""
        self.steps[-1].append((ALLOC, nbytes))
        self.requests += 1
        return self.requests - 1

    def free(self, ordinal: int | None) -> None:
        """Take down the free of request ``ordinal`` (None: a block requested before the recording)."""
        if ordinal is None:
            self.complete = False
        else:
            self.steps[-1].append((FREE, ordinal))

    def mark_step(self) -> None:
        """A step begins (the device's hook: a recording read back later notes where)."""
        self.next_step()

    def next_step(self) -> None:
        self.steps.append([])

    def record(self, batch_size: int) -> AllocationRecord | None:
        if not self.complete:
            return None
        steps = tuple(tuple(events) for events in self.steps)
        return AllocationRecord(batch_size, self.start, steps, self.expandable, self.places)

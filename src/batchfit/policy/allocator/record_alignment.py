"""How two recorded trials' allocator requests correspond, free of torch: the requests made and
freed together (a workspace alone, a reduction's staging buffer and its semaphores), the match of
each request of one record in the other, and what the last step hands on to the next (the steady
state a replay repeats). ``policy.allocator.allocation_replay`` builds its replay on them."""

from __future__ import annotations

from batchfit.policy.allocator.allocation_record import ALLOC, FREE, AllocatorEvent


def requests_in(steps: tuple[tuple[AllocatorEvent, ...], ...]) -> int:
    return sum(1 for events in steps for kind, _ in events if kind == ALLOC)


def request_kinds(steps: tuple[tuple[AllocatorEvent, ...], ...]) -> tuple[set[int], set[int], set[int]]:
    """The requests never freed; those made and freed alone, with nothing between (transient: a
    workspace); and those made and freed together with others (scratch: a reduction's staging
    buffer and its semaphores)."""
    freed = {value for events in steps for kind, value in events if kind == FREE}
    transient: set[int] = set()
    scratch: set[int] = set()
    for first, count in request_groups(steps).items():
        (transient if count == 1 else scratch).update(range(first, first + count))
    return set(range(requests_in(steps))) - freed, transient, scratch


#: The most requests a kernel makes and frees together (a staging buffer and its semaphores).
MAX_GROUP = 8


def request_groups(steps: tuple[tuple[AllocatorEvent, ...], ...]) -> dict[int, int]:
    """The requests made and freed together with nothing else between, by the ordinal of each
    group's first request: how many it holds (1: a workspace alone)."""
    found: dict[int, int] = {}
    ordinal = 0
    for events in steps:
        position = 0
        while position < len(events):
            if events[position][0] != ALLOC:
                position += 1
                continue
            count = _group_at(events[position : position + 2 * MAX_GROUP], ordinal)
            if count:
                found[ordinal] = count
            ordinal, position = ordinal + max(count, 1), position + max(2 * count, 1)
    return found


def _group_at(events: tuple[AllocatorEvent, ...], ordinal: int) -> int:
    """How many requests the group that begins ``events`` (with request ``ordinal``) holds; 0: none
    (a free of another request comes first, or more than ``MAX_GROUP`` are open)."""
    open_requests: set[int] = set()
    made = 0
    for kind, value in events:
        if kind == ALLOC:
            open_requests.add(ordinal + made)
            made += 1
        elif value in open_requests:
            open_requests.remove(value)
            if not open_requests:
                return made
        else:
            return 0
    return 0


def align(
    reference: tuple[tuple[AllocatorEvent, ...], ...], other: tuple[tuple[AllocatorEvent, ...], ...]
) -> list[int | None] | None:
    """For each request of ``reference``, the ordinal of its match in ``other`` (None: a transient
    request ``other`` lacks), step by step; None where they do not align (see
    ``AllocationReplay.of``).
    A matched pair is alike in how it is freed: at matching frees, right after, or never."""
    kinds_ref, kinds_other = request_kinds(reference), request_kinds(other)
    groups_ref, groups_other = request_groups(reference), request_groups(other)
    matched: list[int | None] = []
    to_reference: dict[int, int] = {}
    ref_ordinal = other_ordinal = 0
    for ref_events, other_events in zip(reference, other, strict=True):
        j = i = 0
        while j < len(ref_events) or i < len(other_events):
            ref_kind, ref_value = ref_events[j] if j < len(ref_events) else (None, None)
            kind, value = other_events[i] if i < len(other_events) else (None, None)
            if ref_kind == kind == ALLOC and [ref_ordinal in k for k in kinds_ref] == [
                other_ordinal in k for k in kinds_other
            ]:
                matched.append(other_ordinal)
                to_reference[other_ordinal] = ref_ordinal
                ref_ordinal, other_ordinal, j, i = ref_ordinal + 1, other_ordinal + 1, j + 1, i + 1
            elif ref_kind == kind == FREE and value is not None and to_reference.get(value) == ref_value:
                j, i = j + 1, i + 1
            elif kind == ALLOC and other_ordinal in groups_other:  # a workspace only ``other`` has
                count = groups_other[other_ordinal]
                other_ordinal, i = other_ordinal + count, i + 2 * count
            elif ref_kind == ALLOC and ref_ordinal in groups_ref:  # one only ``reference`` has
                count = groups_ref[ref_ordinal]
                matched.extend([None] * count)
                ref_ordinal, j = ref_ordinal + count, j + 2 * count
            elif kind == ALLOC and other_ordinal in kinds_other[0]:  # made once, by the first trial
                other_ordinal, i = other_ordinal + 1, i + 1
            else:
                return None
    return matched


def frees_are_valid(steps: tuple[tuple[AllocatorEvent, ...], ...]) -> bool:
    """Each free names a request made before it and not yet freed."""
    live: set[int] = set()
    ordinal = 0
    for events in steps:
        for kind, value in events:
            if kind == ALLOC:
                live.add(ordinal)
                ordinal += 1
            elif value not in live:
                return False
            else:
                live.remove(value)
    return True


def handed_on(
    steps: tuple[tuple[AllocatorEvent, ...], ...], lines: list[tuple[float, float]]
) -> tuple[tuple[int, int], ...] | None:
    """Pairs (a request of an earlier step that the last step frees, the request of the last step
    that takes its place for the next), in request order; None where they do not pair up (another
    count, or other sizes: the last step is not yet the steady state)."""
    if len(steps) < 2:
        return None
    first = requests_in(steps[:-1])
    last = steps[-1]
    count = sum(1 for kind, _ in last if kind == ALLOC)
    freed_earlier = sorted(value for kind, value in last if kind == FREE and value < first)
    freed_here = {value for kind, value in last if kind == FREE and value >= first}
    kept = [ordinal for ordinal in range(first, first + count) if ordinal not in freed_here]
    if len(freed_earlier) != len(kept):
        return None
    if any(lines[a] != lines[b] for a, b in zip(freed_earlier, kept, strict=True)):
        return None
    return tuple(zip(freed_earlier, kept, strict=True))

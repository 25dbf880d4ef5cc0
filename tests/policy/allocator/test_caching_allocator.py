"""The modelled CUDA caching allocator: its rules on worked cases, and its invariants against brute
force over random request sequences."""

from __future__ import annotations

import random

import pytest

from batchfit.policy.allocator.allocator_blocks import LARGE_PAGE, SMALL_PAGE, Block, rounded, segment_size
from batchfit.policy.allocator.caching_allocator import AllocatorOutOfMemory, CachingAllocator

KiB, MiB = 1 << 10, 1 << 20


@pytest.mark.parametrize(
    ("request_bytes", "block", "segment"),
    [
        (1, 512, 2 * MiB),
        (512, 512, 2 * MiB),
        (513, 1024, 2 * MiB),
        (MiB, MiB, 2 * MiB),
        (MiB + 1, MiB + 512, 20 * MiB),
        (10 * MiB - 512, 10 * MiB - 512, 20 * MiB),
        (10 * MiB, 10 * MiB, 10 * MiB),
        (11 * MiB + 1, 11 * MiB + 512, 12 * MiB),
        (13 * MiB, 13 * MiB, 14 * MiB),
    ],
)
def test_a_request_is_rounded_and_takes_its_pools_segment(
    request_bytes: int, block: int, segment: int
) -> None:
    assert rounded(request_bytes) == block
    assert segment_size(block) == segment
    allocator = CachingAllocator()
    # What is left of the new segment is split off only from 512 bytes (small pool) or past 1 MiB.
    whole = segment - block < (512 if block <= MiB else MiB + 1)
    assert allocator.malloc(request_bytes).size == (segment if whole else block)
    assert allocator.reserved_bytes == segment


def test_small_requests_share_a_segment_and_large_ones_split_only_past_a_mebibyte() -> None:
    allocator = CachingAllocator()
    first, second = allocator.malloc(KiB), allocator.malloc(3 * KiB)
    assert second.address == first.address + KiB and allocator.reserved_bytes == 2 * MiB
    # 19.5 MiB of a 20 MiB segment would leave 0.5 MiB: not split, the whole segment is allocated.
    whole = allocator.malloc(19 * MiB + 512 * KiB)
    assert whole.size == 20 * MiB and allocator.allocated_bytes == 4 * KiB + 20 * MiB
    # 2 MiB of one leaves 18 MiB: split, and the next request of that pool lands in the rest.
    part = allocator.malloc(2 * MiB)
    after = allocator.malloc(5 * MiB)
    assert part.size == 2 * MiB and after.address == part.address + 2 * MiB
    assert allocator.reserved_bytes == 2 * MiB + 20 * MiB + 20 * MiB


def test_the_smallest_free_block_that_holds_a_request_is_taken() -> None:
    allocator = CachingAllocator()
    blocks = [allocator.malloc(size * MiB) for size in (12, 16, 14)]  # three segments of their own
    for block in blocks:
        allocator.free(block)
    chosen = allocator.malloc(13 * MiB)
    assert chosen.address == blocks[2].address  # 14 MiB, not 16; and 12 does not hold it
    assert allocator.reserved_bytes == 42 * MiB  # no new segment


def test_a_freed_block_merges_with_its_free_neighbours_and_empty_cache_gives_whole_segments_back() -> None:
    allocator = CachingAllocator()
    a, b, c = (allocator.malloc(2 * MiB) for _ in range(3))  # one 20 MiB segment, 14 MiB left over
    allocator.free(a)
    allocator.free(c)  # merges with the 14 MiB after it
    assert [size for size, _ in allocator.layout()[0][1]] == [2 * MiB, 2 * MiB, 16 * MiB]
    allocator.empty_cache()
    assert allocator.reserved_bytes == 20 * MiB  # b still holds the segment
    allocator.free(b)
    assert allocator.layout()[0][1] == ((20 * MiB, False),)
    allocator.empty_cache()
    assert (allocator.reserved_bytes, allocator.allocated_bytes, allocator.layout()) == (0, 0, ())


def test_past_the_limit_it_frees_its_cache_and_retries_and_fails_only_when_that_is_not_enough() -> None:
    allocator = CachingAllocator(limit_bytes=40 * MiB)
    cached = allocator.malloc(12 * MiB)
    allocator.free(cached)  # a 12 MiB segment, cached
    big = allocator.malloc(30 * MiB)  # 12 + 30 > 40: the cache is given back, then it fits
    assert allocator.retries == 1 and allocator.reserved_bytes == 30 * MiB
    with pytest.raises(AllocatorOutOfMemory):  # a new 20 MiB segment: over the limit, nothing cached
        allocator.malloc(2 * MiB)
    assert allocator.retries == 2 and allocator.reserved_bytes == 30 * MiB
    allocator.free(big)


def test_fragmentation_can_fail_a_request_that_the_allocated_bytes_would_allow() -> None:
    allocator = CachingAllocator(limit_bytes=40 * MiB)
    pieces = [allocator.malloc(2 * MiB) for _ in range(20)]  # two 20 MiB segments, full
    for piece in pieces[::2]:
        allocator.free(piece)  # 20 MiB free, in 2 MiB holes: no segment is wholly free
    assert allocator.allocated_bytes == 20 * MiB and allocator.reserved_bytes == 40 * MiB
    with pytest.raises(AllocatorOutOfMemory, match="limit of 41943040 bytes"):
        allocator.malloc(4 * MiB)
    assert allocator.retries == 1 and allocator.allocated_bytes == 20 * MiB


def test_peaks_follow_the_statistics_and_reset_to_what_is_held_now() -> None:
    allocator = CachingAllocator()
    block = allocator.malloc(30 * MiB)
    allocator.free(block)
    assert (allocator.peak_allocated_bytes, allocator.peak_reserved_bytes) == (30 * MiB, 30 * MiB)
    allocator.reset_peaks()
    assert (allocator.peak_allocated_bytes, allocator.peak_reserved_bytes) == (0, 30 * MiB)
    with pytest.raises(ValueError, match="is not allocated"):
        allocator.free(block)


# With expandable segments: each pool one segment of address space, mapped by pages as it grows.


def test_an_expandable_pool_grows_by_whole_pages_and_keeps_its_blocks_in_one_segment() -> None:
    allocator = CachingAllocator(expandable=True)
    first = allocator.malloc(30 * MiB)  # two 20 MiB pages; the 10 MiB past it is split off
    assert allocator.reserved_bytes == 40 * MiB and first.size == 30 * MiB
    # 15 MiB: the free 10 MiB at the end grows into the next page, so it lands right after.
    second = allocator.malloc(15 * MiB)
    assert second.address == first.address + 30 * MiB and allocator.reserved_bytes == 60 * MiB
    small = allocator.malloc(KiB)  # the small pool's own segment, by 2 MiB pages
    assert allocator.reserved_bytes == 62 * MiB
    assert allocator.segments() == (
        ((KiB, True), (2 * MiB - KiB, False)),
        ((30 * MiB, True), (15 * MiB, True), (15 * MiB, False)),
    )
    # Any remainder of 512 bytes or more is split off, in the large pool too (not past 1 MiB only).
    third = allocator.malloc(15 * MiB - 512)
    assert third.size == 15 * MiB - 512 and allocator.segments()[1][-1] == (512, False)
    allocator.free(small)
    assert allocator.segments()[0] == ((2 * MiB, False),)


def test_an_expandable_allocator_checks_its_cap_against_a_new_segment_but_maps_whole_pages() -> None:
    allocator = CachingAllocator(limit_bytes=64 * MiB, expandable=True)
    held = allocator.malloc(40 * MiB)  # two pages, exactly
    # 23 MiB takes a 24 MiB segment in the cap's reckoning: 40 + 24 is within 64; the pool maps two
    # more 20 MiB pages, so what it reserves passes the cap.
    allocator.malloc(23 * MiB)
    assert allocator.reserved_bytes == 80 * MiB and allocator.peak_reserved_bytes == 80 * MiB
    with pytest.raises(AllocatorOutOfMemory):  # 18 MiB: the free 17 MiB does not hold it; 80 + 18 > 64
        allocator.malloc(18 * MiB)
    assert allocator.retries == 1 and allocator.reserved_bytes == 80 * MiB  # no free page to unmap
    allocator.free(held)
    allocator.empty_cache()  # the two pages under the freed 40 MiB are unmapped
    assert allocator.reserved_bytes == 40 * MiB
    again = allocator.malloc(18 * MiB)  # 40 + 18 is within 64: one page mapped, at the lowest address
    assert again.address == held.address and allocator.reserved_bytes == 60 * MiB


def test_freeing_the_cache_unmaps_whole_pages_and_the_next_request_maps_them_at_the_lowest_address() -> None:
    allocator = CachingAllocator(expandable=True)
    a = allocator.malloc(10 * MiB)
    b = allocator.malloc(45 * MiB)
    c = allocator.malloc(5 * MiB)
    assert allocator.reserved_bytes == 60 * MiB  # three pages, filled
    allocator.free(b)  # free from 10 MiB to 55 MiB: only the page from 20 to 40 MiB lies wholly inside
    allocator.empty_cache()
    assert allocator.reserved_bytes == 40 * MiB
    blocks = ((10 * MiB, True), (10 * MiB, False), (20 * MiB, None), (15 * MiB, False), (5 * MiB, True))
    assert allocator.segments() == ((), blocks)
    # 25 MiB: the free 10 MiB, then the hole, hold it: the hole is mapped again, not new pages at the end.
    d = allocator.malloc(25 * MiB)
    assert d.address == a.address + 10 * MiB and allocator.reserved_bytes == 60 * MiB
    assert c.address == a.address + 55 * MiB


def test_the_best_fit_passes_over_a_block_that_could_grow_where_another_holds_the_request() -> None:
    allocator = CachingAllocator(expandable=True)
    blocks = [allocator.malloc(size * MiB) for size in (6, 2, 8)]  # one 20 MiB page, 4 MiB free at its end
    allocator.free(blocks[0])  # a 6 MiB hole at the start; the 4 MiB at the end could grow
    chosen = allocator.malloc(3 * MiB)
    assert chosen.address == blocks[0].address  # the hole, though the end's 4 MiB is the smaller
    again = allocator.malloc(MiB + 512)  # now the hole's 3 MiB and the end's 4 MiB: the hole
    assert again.address == blocks[0].address + 3 * MiB


def test_an_expandable_allocator_starts_from_its_two_pools() -> None:
    with pytest.raises(ValueError, match="2 segments"):
        CachingAllocator.starting_from((), expandable=True)


def _free_blocks(allocator: CachingAllocator) -> list[tuple[int, int, bool, int]]:
    """Every free block's size, address, pool (small or not) and reach (itself and the unmapped
    space right after it, that past the last mapped block unbounded), read from the layout; and its
    invariants: no two free (or unmapped) neighbours, only whole pages unmapped, the statistics the
    sums of the blocks, within the cap (with expandable segments, past it by less than a page)."""
    found = []
    mapped = allocated = 0
    for position, (address, blocks) in enumerate(allocator.layout()):
        small = position == 0 if allocator.expandable else sum(size for size, _ in blocks) == 2 * MiB
        page = SMALL_PAGE if small else LARGE_PAGE
        offset = 0
        for index, (size, state) in enumerate(blocks):
            if state is None:
                assert offset % page == 0 and size % page == 0, "unmapped space not whole pages"
            else:
                mapped += size
                allocated += size if state else 0
            after = blocks[index + 1] if index + 1 < len(blocks) else None
            assert state is True or after is None or state != after[1], "two free or unmapped neighbours"
            if state is False:
                unbounded = allocator.expandable and after is None
                reach = size + (1 << 60 if unbounded else after[0] if after and after[1] is None else 0)
                found.append((size, address + offset, small, reach))
            offset += size
    assert (allocator.allocated_bytes, allocator.reserved_bytes) == (allocated, mapped)
    if allocator.limit_bytes is not None:
        headroom = LARGE_PAGE if allocator.expandable else 1
        assert allocator.reserved_bytes < allocator.limit_bytes + headroom
    return found


@pytest.mark.parametrize("expandable", [False, True], ids=["segments", "expandable"])
@pytest.mark.parametrize("seed", range(12))
def test_random_requests_keep_every_invariant_and_take_the_best_fit(seed: int, expandable: bool) -> None:
    rng = random.Random(seed)
    allocator = CachingAllocator(limit_bytes=rng.choice([None, 96 * MiB, 160 * MiB]), expandable=expandable)
    live: list[Block] = []
    failures = 0
    for _ in range(400):
        if live and rng.random() < 0.45:
            allocator.free(live.pop(rng.randrange(len(live))))
        elif rng.random() < 0.05:
            allocator.empty_cache()
        else:
            sizes = (rng.randint(1, 64 * KiB), rng.randint(MiB, 9 * MiB), rng.randint(10, 40) * MiB)
            size = rng.choice(sizes)
            free_before = _free_blocks(allocator)
            try:
                block = allocator.malloc(size)
            except AllocatorOutOfMemory:
                failures += 1
                continue
            live.append(block)
            # Brute force: the smallest free block of its pool that holds it, the lowest address
            # among equals; with expandable segments, passed over for the next in that order while
            # that one reaches less far.
            small = rounded(size) <= MiB
            holding = sorted(
                (b, address, reach)
                for b, address, pool, reach in free_before
                if b >= rounded(size) and pool == small
            )
            if holding:
                chosen = 0
                while (
                    expandable and chosen + 1 < len(holding) and holding[chosen + 1][2] < holding[chosen][2]
                ):
                    chosen += 1
                assert block.address == holding[chosen][1]
        _free_blocks(allocator)
        assert sum(block.size for block in live) == allocator.allocated_bytes
    for block in live:
        allocator.free(block)
    allocator.empty_cache()
    assert allocator.reserved_bytes == 0 and allocator.segments() == (((), ()) if expandable else ())
    assert allocator.retries >= failures and (failures == 0 or allocator.limit_bytes is not None)


def test_segments_lie_in_the_order_their_places_rank_them() -> None:
    # The best fit breaks a tie between two free blocks of one size by address: the segment placed
    # lower takes the request. CUDA's driver places a new segment where it finds room, often below
    # the start's; a record's ``places`` say where, and the model follows them.
    first = ((10 * MiB, True), (10 * MiB, False))
    second = ((2 * MiB, True), (10 * MiB, False), (8 * MiB, True))
    taken_first = ((10 * MiB, True), (10 * MiB, True)), second
    taken_second = ((2 * MiB, True), (10 * MiB, True), (8 * MiB, True)), first
    for places, expected in (((), taken_first), ((0, 1), taken_first), ((1, 0), taken_second)):
        allocator = CachingAllocator.starting_from((first, second), places=places)
        allocator.malloc(10 * MiB)
        assert allocator.segments()[:2] == expected
    for places, new_first in (((0, 1), False), ((1, 0), True)):
        allocator = CachingAllocator.starting_from((first,), places=places)
        allocator.malloc(12 * MiB)  # no free block holds it: a segment of its own, placed second
        own = ((12 * MiB, True),)
        assert allocator.segments() == ((own, first) if new_first else (first, own))

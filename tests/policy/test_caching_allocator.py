"""The modelled CUDA caching allocator: its rules on worked cases, and its invariants against brute
force over random request sequences."""

from __future__ import annotations

import itertools
import random

import pytest

from batchfit.policy.caching_allocator import (
    AllocatorOutOfMemory,
    Block,
    CachingAllocator,
    rounded,
    segment_size,
)

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


def _check(allocator: CachingAllocator, live: list[Block]) -> None:
    """The invariants, from the layout: segments tile exactly, no two free neighbours, the
    statistics are the sums of the blocks, and what is live is what is allocated."""
    allocated = reserved = 0
    for _, blocks in allocator.layout():
        reserved += sum(size for size, _ in blocks)
        allocated += sum(size for size, used in blocks if used)
        states = [used for _, used in blocks]
        assert all(a or b for a, b in itertools.pairwise(states)), "two free neighbours not merged"
    assert (allocator.allocated_bytes, allocator.reserved_bytes) == (allocated, reserved)
    assert allocated == sum(block.size for block in live)
    if allocator.limit_bytes is not None:
        assert reserved <= allocator.limit_bytes


def _free_blocks(allocator: CachingAllocator) -> list[tuple[int, int, bool]]:
    """Every free block's size, address and pool (small: in a 2 MiB segment), from the layout."""
    found = []
    for address, blocks in allocator.layout():
        small, offset = sum(size for size, _ in blocks) == 2 * MiB, 0
        for size, used in blocks:
            if not used:
                found.append((size, address + offset, small))
            offset += size
    return found


@pytest.mark.parametrize("seed", range(12))
def test_random_requests_keep_every_invariant_and_take_the_best_fit(seed: int) -> None:
    rng = random.Random(seed)
    allocator = CachingAllocator(limit_bytes=rng.choice([None, 96 * MiB, 160 * MiB]))
    live: list[Block] = []
    failures = 0
    for _ in range(400):
        if live and rng.random() < 0.45:
            allocator.free(live.pop(rng.randrange(len(live))))
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
            # The brute-force best fit: the smallest free block of its pool that held it, the
            # lowest address among equals.
            small = rounded(size) <= MiB
            holding = [
                (b, address) for b, address, pool in free_before if b >= rounded(size) and pool == small
            ]
            if holding:
                assert block.address == min(holding)[1]
        _check(allocator, live)
    for block in live:
        allocator.free(block)
    allocator.empty_cache()
    assert allocator.reserved_bytes == 0 and allocator.retries >= failures
    assert failures == 0 or allocator.limit_bytes is not None

"""The modelled caching allocator's expandable segments (``expandable_segments:True`` in
``PYTORCH_CUDA_ALLOC_CONF``): each pool one segment of address space, mapped by pages.

Each pool's segment grows by pages (2 MiB for the small pool, 20 MiB for the large), mapped as
needed. With no free block that holds a request, the allocator maps the pages it lacks at the
lowest address where free and unmapped space together hold it (a free block just before an unmapped
stretch grows into it), so the pages of a block freed anywhere serve a request of any size once they
are unmapped. The cap is checked before mapping, against what a new segment would take (the
request's ``segment_size``), though only whole pages are mapped: what is reserved may pass the cap
by less than a page. The best fit passes over a free block that could grow into unmapped space
where a block further in the size order reaches less far; any remainder of 512 bytes or more is
split off, in both pools. Freeing the cache (``empty_cache``, and before the retry) unmaps every
page that free blocks wholly cover.
"""

from __future__ import annotations

from batchfit.policy.allocator.allocator_blocks import (
    LARGE_PAGE,
    SMALL_PAGE,
    VIRTUAL_BYTES,
    Block,
    BlockLists,
    BlockState,
    listed,
)


class ExpandableSegments:
    """The two pools' segments of one allocator, over its ``BlockLists``; each pool's is made at its
    first request (or by the state a trial starts from: ``bases``)."""

    def __init__(self, blocks: BlockLists) -> None:
        self.blocks = blocks
        self.bases: dict[bool, int] = {}  # a pool's segment: where its address space begins

    def grow(self, size: int, small: bool) -> tuple[Block, int]:
        """A free block of at least ``size`` made by mapping the pages it lacks, out of its pool's
        free list, and the bytes mapped."""
        candidate = self._room(size, small)
        mapped = 0
        if not candidate.mapped:
            candidate, pages = self._map(candidate, min(candidate.size, size))
            mapped += pages
        while candidate.size < size:  # a free block, then unmapped space: map what it lacks
            assert candidate.next is not None and not candidate.next.mapped
            candidate, pages = self._map(candidate.next, min(size - candidate.size, candidate.next.size))
            mapped += pages
        self.blocks.remove(candidate)
        return candidate, mapped

    def unmap_free(self, small: bool) -> int:
        """Unmap every page that the pool's free blocks wholly cover; the bytes unmapped."""
        return sum(self._unmap(block) for _, _, block in list(self.blocks.free[small]))

    def layout(self) -> tuple[tuple[int, tuple[tuple[int, BlockState], ...]], ...]:
        """The small pool's and the large pool's segments, each its address and its blocks up to its
        last mapped one (an address of 0 where the pool has none)."""
        pools = []
        for small in (True, False):
            base = self.bases.get(small)
            blocks = [] if base is None else listed(self.blocks.heads[base])
            while blocks and blocks[-1][1] is None:
                blocks.pop()  # the address space past the last mapped block
            pools.append((base or 0, tuple(blocks)))
        return tuple(pools)

    def _room(self, size: int, small: bool) -> Block:
        """The lowest place in the pool's expandable segment where free and unmapped blocks in a
        row hold ``size`` (its first block: unmapped, or free just before unmapped space)."""
        if small not in self.bases:
            base = self.blocks.new_address()
            whole = Block(base, VIRTUAL_BYTES, small, mapped=False)
            self.bases[small], self.blocks.heads[base] = base, whole
            self.blocks.unmapped[small].append((base, whole))
        current: Block | None
        for _, unmapped in self.blocks.unmapped[small]:
            first = unmapped
            if first.prev is not None and first.prev.mapped and not first.prev.allocated:
                first = first.prev
            room, current = 0, first
            while room < size and current is not None and not current.allocated:
                room, current = room + current.size, current.next
            if room >= size:
                return first
        raise AssertionError("an expandable segment's address space holds any request")

    def _map(self, block: Block, nbytes: int) -> tuple[Block, int]:
        """Map the pages that hold the first ``nbytes`` of unmapped ``block``: the mapped block,
        merged with its free neighbours and in its pool's free list, and the bytes mapped."""
        page = SMALL_PAGE if block.small else LARGE_PAGE
        mapped = min(block.size, -(-nbytes // page) * page)
        self.blocks.remove_unmapped(block)
        if mapped < block.size:
            rest = Block(
                block.address + mapped,
                block.size - mapped,
                block.small,
                prev=block,
                next=block.next,
                mapped=False,
            )
            if block.next is not None:
                block.next.prev = rest
            block.next, block.size = rest, mapped
            self.blocks.insert_unmapped(rest)
        block.mapped = True
        merged = self.blocks.merged(block)
        self.blocks.insert(merged)
        return merged, mapped

    def _unmap(self, block: Block) -> int:
        """Unmap the pages that free ``block`` wholly covers (what is left of it stays free); the
        bytes unmapped."""
        page = SMALL_PAGE if block.small else LARGE_PAGE
        base = self.bases[block.small]
        start, end = block.address - base, block.address - base + block.size
        first, last = -(-start // page) * page, end // page * page
        if first >= last:
            return 0
        self.blocks.remove(block)
        if first > start:
            before = Block(block.address, first - start, block.small, prev=block.prev, next=block)
            self.blocks.link(before)
            self.blocks.insert(before)
        if end > last:
            after = Block(base + last, end - last, block.small, prev=block, next=block.next)
            self.blocks.link(after)
            self.blocks.insert(after)
        block.address, block.size, block.mapped = base + first, last - first, False
        self.blocks.insert_unmapped(self.blocks.merged(block))
        return last - first


def reach(block: Block) -> int:
    """How large a free block can grow without a new place: itself and the unmapped space after it."""
    following = block.next
    return block.size + (following.size if following is not None and not following.mapped else 0)

"""The modelled caching allocator's blocks: the block and the segment a request takes, and the
blocks themselves, linked to their neighbours in a segment and listed for the best fit."""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

MIN_BLOCK = 512
SMALL_REQUEST = 1 << 20  # the largest request of the small pool
SMALL_SEGMENT = 2 << 20
LARGE_SEGMENT = 20 << 20  # what a request of 1-10 MiB takes from the device
LARGE_REQUEST = 10 << 20  # from here a request takes a segment of its own...
LARGE_ROUNDING = 2 << 20  # ...rounded up to this


SMALL_PAGE = SMALL_SEGMENT  # what an expandable small pool maps at a time
LARGE_PAGE = LARGE_SEGMENT  # what an expandable large pool maps at a time
#: The address space of an expandable segment (CUDA reserves 1 1/8 of the device's memory): more
#: than any cap, a whole number of either page.
VIRTUAL_BYTES = LARGE_PAGE << 20

#: A block's state in a layout: allocated (True), free (False), or, in an expandable segment,
#: address space with no pages mapped (None).
BlockState = bool | None
#: Segments in address order, each its blocks' (size, state) in address order. An expandable
#: allocator's are its two pools' segments, the small pool's first (empty where nothing is mapped),
#: each up to its last mapped block.
Segments = tuple[tuple[tuple[int, BlockState], ...], ...]


@dataclass(eq=False)
class Block:
    """A piece of a segment: free or allocated; ``prev``/``next`` are its neighbours in the segment."""

    address: int
    size: int
    small: bool
    allocated: bool = False
    prev: Block | None = field(default=None, repr=False)
    next: Block | None = field(default=None, repr=False)
    mapped: bool = True  # False: an expandable segment's address space, no pages behind it

    @property
    def split(self) -> bool:
        return self.prev is not None or self.next is not None


def rounded(nbytes: int) -> int:
    """The block size a request of ``nbytes`` takes."""
    return max(MIN_BLOCK, -(-nbytes // MIN_BLOCK) * MIN_BLOCK)


def segment_size(size: int) -> int:
    """What the allocator asks the device for when no free block holds a (rounded) ``size``."""
    if size <= SMALL_REQUEST:
        return SMALL_SEGMENT
    if size < LARGE_REQUEST:
        return LARGE_SEGMENT
    return -(-size // LARGE_ROUNDING) * LARGE_ROUNDING


def listed(head: Block) -> list[tuple[int, BlockState]]:
    """The sizes and states of the blocks of the segment that begins with ``head``, in address order."""
    blocks: list[tuple[int, BlockState]] = []
    block: Block | None = head
    while block is not None:
        blocks.append((block.size, block.allocated if block.mapped else None))
        block = block.next
    return blocks


class BlockLists:
    """One allocator's blocks: the first block of each segment (by address), each pool's free blocks
    sorted by size then address (the best fit's order), and each pool's unmapped blocks sorted by
    address. ``small`` picks the pool (True: the small pool). Each segment has its own stretch of
    addresses, in the order ``places`` ranks the first ones (as a recording saw them), the rest above."""

    def __init__(self, places: Sequence[int] = ()) -> None:
        self.heads: dict[int, Block] = {}  # address -> first block of each segment
        self.free: dict[bool, list[tuple[int, int, Block]]] = {True: [], False: []}  # by size, address
        self.unmapped: dict[bool, list[tuple[int, Block]]] = {True: [], False: []}  # by address
        ranked = [(rank + 1) << 48 for rank in places]  # segments never overlap
        self._addresses = itertools.chain(
            ranked, itertools.count(start=(len(ranked) + 1) << 48, step=1 << 48)
        )

    def new_address(self) -> int:
        """Where a new segment begins."""
        return next(self._addresses)

    def insert(self, block: Block) -> None:
        bisect.insort(self.free[block.small], (block.size, block.address, block))

    def remove(self, block: Block) -> None:
        pool = self.free[block.small]
        index = bisect.bisect_left(pool, (block.size, block.address))
        if index == len(pool) or pool[index][2] is not block:
            raise ValueError(f"block at {block.address:#x} is not in its free pool")
        del pool[index]

    def insert_unmapped(self, block: Block) -> None:
        bisect.insort(self.unmapped[block.small], (block.address, block), key=lambda entry: entry[0])

    def remove_unmapped(self, block: Block) -> None:
        self.unmapped[block.small].remove((block.address, block))

    def link(self, block: Block) -> None:
        """Splice ``block`` between its ``prev`` and ``next``."""
        if block.prev is None:
            self.heads[block.address] = block
        else:
            block.prev.next = block
        if block.next is not None:
            block.next.prev = block

    def merged(self, block: Block) -> Block:
        """``block`` merged with its neighbours in its state (free, or unmapped), taken out of their
        lists; it keeps the lowest address."""
        for neighbour in (block.prev, block.next):
            if neighbour is None or neighbour.allocated or neighbour.mapped != block.mapped:
                continue
            if neighbour.mapped:
                self.remove(neighbour)
            else:
                self.remove_unmapped(neighbour)
            if neighbour is block.prev:
                block.address, block.prev = neighbour.address, neighbour.prev
                if neighbour.prev is None:
                    self.heads[block.address] = block
                else:
                    neighbour.prev.next = block
            else:
                block.next = neighbour.next
                if neighbour.next is not None:
                    neighbour.next.prev = block
            block.size += neighbour.size
        return block

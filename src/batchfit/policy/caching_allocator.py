"""PyTorch's CUDA caching allocator, modelled: where each block lands, what is reserved, when it retries.

The rules of ``c10/cuda/CUDACachingAllocator.cpp`` at its defaults (no ``max_split_size_mb``, no
expandable segments, no rounding to powers of two): sizes round up to 512 bytes; requests up to
1 MiB share 2 MiB segments (the small pool), requests up to 10 MiB take 20 MiB segments, larger
ones a segment of their own rounded up to 2 MiB (the large pool). A request takes the smallest free
block of its pool that holds it (ties by address) and splits off the rest when what remains is at
least 512 bytes (small pool) or more than 1 MiB (large pool). A freed block merges with free
neighbours of its segment. With no free block, a new segment is taken if the reserved total stays
within the limit (``set_per_process_memory_fraction``); else every wholly free segment is given
back and the request tried once more (an allocator retry), and past that it is out of memory.

Torch-free: the CPU stand-in for a GPU (``runtime.caching``) drives it with the real allocations of
the real model, so the CUDA device's logic (reserved peaks, retries, fragmentation over steps) runs
where there is no GPU.
"""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass, field

MIN_BLOCK = 512
SMALL_REQUEST = 1 << 20  # the largest request of the small pool
SMALL_SEGMENT = 2 << 20
LARGE_SEGMENT = 20 << 20  # what a request of 1-10 MiB takes from the device
LARGE_REQUEST = 10 << 20  # from here a request takes a segment of its own...
LARGE_ROUNDING = 2 << 20  # ...rounded up to this


#: Segments in address order, each its blocks' (size, allocated) in address order.
Segments = tuple[tuple[tuple[int, bool], ...], ...]


class AllocatorOutOfMemory(Exception):
    """A request the modelled allocator cannot place within its limit, even after freeing its cache."""


@dataclass(eq=False)
class Block:
    """A piece of a segment: free or allocated; ``prev``/``next`` are its neighbours in the segment."""

    address: int
    size: int
    small: bool
    allocated: bool = False
    prev: Block | None = field(default=None, repr=False)
    next: Block | None = field(default=None, repr=False)

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


class CachingAllocator:
    """One device's caching allocator. ``limit_bytes`` caps what it reserves (None: no cap).

    Statistics as ``torch.cuda.memory_stats`` keeps them: allocated and reserved bytes now and at
    their peaks since ``reset_peaks``, and ``retries`` (``num_alloc_retries``).
    """

    def __init__(self, limit_bytes: int | None = None) -> None:
        self.limit_bytes = limit_bytes
        self.allocated_bytes = self.reserved_bytes = 0
        self.peak_allocated_bytes = self.peak_reserved_bytes = 0
        self.retries = 0
        self._free: dict[bool, list[tuple[int, int, Block]]] = {True: [], False: []}  # by size, address
        self._segments: dict[int, Block] = {}  # address -> first block of each segment
        self._addresses = itertools.count(start=1 << 32, step=1 << 40)  # segments never overlap

    @classmethod
    def starting_from(cls, segments: Segments, limit_bytes: int | None = None) -> CachingAllocator:
        """An allocator whose segments are ``segments`` (as ``segments()`` lists them): the state a
        trial starts from, its resident blocks allocated and the rest of their segments free."""
        allocator = cls(limit_bytes)
        for blocks in segments:
            previous: Block | None = None
            small = sum(size for size, _ in blocks) == SMALL_SEGMENT  # only the small pool's are 2 MiB
            address = next(allocator._addresses)
            for size, allocated in blocks:
                block = Block(address, size, small, allocated, prev=previous)
                if previous is None:
                    allocator._segments[address] = block
                else:
                    previous.next = block
                if allocated:
                    allocator.allocated_bytes += size
                else:
                    allocator._insert(block)
                allocator.reserved_bytes += size
                previous, address = block, address + size
        allocator.reset_peaks()
        return allocator

    def malloc(self, nbytes: int) -> Block:
        """Place a request of ``nbytes``: the block it gets, or AllocatorOutOfMemory."""
        size = rounded(nbytes)
        small = size <= SMALL_REQUEST
        block = self._best_fit(size, small)
        if block is None:
            block = self._new_segment(size, small)
        if block is None:  # give back every wholly free segment, then try once more
            self.empty_cache()
            self.retries += 1
            block = self._new_segment(size, small)
        if block is None:
            raise AllocatorOutOfMemory(
                f"tried to allocate {segment_size(size)} bytes with {self.reserved_bytes} reserved "
                f"({self.allocated_bytes} allocated) and a limit of {self.limit_bytes} bytes"
            )
        remaining = block.size - size
        if (remaining >= MIN_BLOCK) if small else (remaining > SMALL_REQUEST):
            rest = Block(block.address + size, remaining, small, prev=block, next=block.next)
            if block.next is not None:
                block.next.prev = rest
            block.next, block.size = rest, size
            self._insert(rest)
        block.allocated = True
        self.allocated_bytes += block.size
        self.peak_allocated_bytes = max(self.peak_allocated_bytes, self.allocated_bytes)
        return block

    def free(self, block: Block) -> None:
        """Give ``block`` back to its pool, merged with its free neighbours."""
        if not block.allocated:
            raise ValueError(f"block at {block.address:#x} is not allocated")
        block.allocated = False
        self.allocated_bytes -= block.size
        for neighbour in (block.prev, block.next):
            if neighbour is not None and not neighbour.allocated:
                self._remove(neighbour)
                if neighbour is block.prev:
                    block.address, block.prev = neighbour.address, neighbour.prev
                    if neighbour.prev is None:
                        self._segments[block.address] = block
                    else:
                        neighbour.prev.next = block
                else:
                    block.next = neighbour.next
                    if neighbour.next is not None:
                        neighbour.next.prev = block
                block.size += neighbour.size
        self._insert(block)

    def empty_cache(self) -> None:
        """Give back every segment with nothing allocated in it (``torch.cuda.empty_cache``)."""
        for small in (True, False):
            for _, _, block in [entry for entry in self._free[small] if not entry[2].split]:
                self._remove(block)
                del self._segments[block.address]
                self.reserved_bytes -= block.size

    def reset_peaks(self) -> None:
        self.peak_allocated_bytes, self.peak_reserved_bytes = self.allocated_bytes, self.reserved_bytes

    def layout(self) -> tuple[tuple[int, tuple[tuple[int, bool], ...]], ...]:
        """Every segment's address and its blocks' sizes and states, in address order: equal
        layouts place every later request alike (``torch.cuda.memory_snapshot``'s content)."""
        segments = []
        for address in sorted(self._segments):
            blocks: list[tuple[int, bool]] = []
            block: Block | None = self._segments[address]
            while block is not None:
                blocks.append((block.size, block.allocated))
                block = block.next
            segments.append((address, tuple(blocks)))
        return tuple(segments)

    def segments(self) -> Segments:
        """Every segment's blocks (sizes and whether allocated), in address order, the addresses
        left out: equal ``segments()`` place every later request alike."""
        return tuple(blocks for _, blocks in self.layout())

    def _best_fit(self, size: int, small: bool) -> Block | None:
        pool = self._free[small]
        index = bisect.bisect_left(pool, (size, -1))
        if index == len(pool):
            return None
        return pool.pop(index)[2]

    def _new_segment(self, size: int, small: bool) -> Block | None:
        need = segment_size(size)
        if self.limit_bytes is not None and self.reserved_bytes + need > self.limit_bytes:
            return None
        block = Block(next(self._addresses), need, small)
        self._segments[block.address] = block
        self.reserved_bytes += need
        self.peak_reserved_bytes = max(self.peak_reserved_bytes, self.reserved_bytes)
        return block

    def _insert(self, block: Block) -> None:
        bisect.insort(self._free[block.small], (block.size, block.address, block))

    def _remove(self, block: Block) -> None:
        pool = self._free[block.small]
        index = bisect.bisect_left(pool, (block.size, block.address))
        if index == len(pool) or pool[index][2] is not block:
            raise ValueError(f"block at {block.address:#x} is not in its free pool")
        del pool[index]

"""PyTorch's CUDA caching allocator, modelled: where each block lands, what is reserved, when it retries.

The rules of ``c10/cuda/CUDACachingAllocator.cpp`` at its defaults (no ``max_split_size_mb``, no
rounding to powers of two), with or without expandable segments (``policy.allocator.expandable_segments``).
Sizes round up to 512 bytes; requests up to 1 MiB share 2 MiB segments (the small pool), requests up
to 10 MiB take 20 MiB segments, larger ones a segment of their own rounded up to 2 MiB (the large
pool; ``policy.allocator.allocator_blocks``). A request takes the smallest free block of its pool that holds
it (ties by address) and splits off the rest when what remains is at least 512 bytes (small pool)
or more than 1 MiB (large pool). A freed block merges with free neighbours of its segment. With no
free block, a new segment is taken if the reserved total stays within the limit
(``set_per_process_memory_fraction``); else every wholly free segment is given back and the request
tried once more (an allocator retry), and past that it is out of memory.

Torch-free: the CPU stand-in for a GPU (``runtime.devices.caching_device``) drives it with the
real allocations of the real model, so the CUDA device's logic (reserved peaks, retries,
fragmentation over steps) runs where there is no GPU.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from batchfit.policy.allocator.allocator_blocks import (
    MIN_BLOCK,
    SMALL_REQUEST,
    SMALL_SEGMENT,
    VIRTUAL_BYTES,
    Block,
    BlockLists,
    BlockState,
    Segments,
    listed,
    rounded,
    segment_size,
)
from batchfit.policy.allocator.expandable_segments import ExpandableSegments, reach


class AllocatorOutOfMemory(Exception):
    """A request (of ``nbytes``) the modelled allocator cannot place within its limit, even after
    freeing its cache."""

    def __init__(self, message: str, nbytes: int = 0) -> None:
        super().__init__(message)
        self.nbytes = nbytes


class CachingAllocator:
    """One device's caching allocator. ``limit_bytes`` caps what it reserves (None: no cap);
    ``expandable``: with expandable segments (``policy.allocator.expandable_segments``); ``places``: the
    segments' order in addresses (``AllocationRecord.places``; without expandable segments).

    Statistics as ``torch.cuda.memory_stats`` keeps them: allocated and reserved bytes now and at
    their peaks since ``reset_peaks``, and ``retries`` (``num_alloc_retries``).
    """

    def __init__(
        self, limit_bytes: int | None = None, expandable: bool = False, places: Sequence[int] = ()
    ) -> None:
        self.limit_bytes = limit_bytes
        self.expandable = expandable
        self.allocated_bytes = self.reserved_bytes = 0
        self.peak_allocated_bytes = self.peak_reserved_bytes = 0
        self.retries = 0
        self._blocks = BlockLists(() if expandable else places)
        self._expandable = ExpandableSegments(self._blocks) if expandable else None

    @classmethod
    def starting_from(
        cls,
        segments: Segments,
        limit_bytes: int | None = None,
        expandable: bool = False,
        places: Sequence[int] = (),
    ) -> CachingAllocator:
        """An allocator whose segments are ``segments`` (as ``segments()`` lists them): the state a
        trial starts from, its resident blocks allocated and the rest of their segments free."""
        allocator = cls(limit_bytes, expandable, places)
        if expandable and len(segments) != 2:
            raise ValueError(f"an expandable allocator has 2 segments (its pools'), not {len(segments)}")
        for position, blocks in enumerate(segments):
            if expandable:
                small = position == 0
                if not blocks:
                    continue
                blocks = (*blocks, (VIRTUAL_BYTES - sum(size for size, _ in blocks), None))
            else:
                small = sum(size for size, _ in blocks) == SMALL_SEGMENT  # only the small pool's are 2 MiB
            allocator._add_segment(blocks, small)
        allocator.reset_peaks()
        return allocator

    def malloc(self, nbytes: int) -> Block:
        """Place a request of ``nbytes``: the block it gets, or AllocatorOutOfMemory."""
        size = rounded(nbytes)
        small = size <= SMALL_REQUEST
        block = self._best_fit(size, small)
        if block is None:
            block = self._grow(size, small)
        if block is None:  # give back what the cache holds whole, then try once more
            self.empty_cache()
            self.retries += 1
            block = self._grow(size, small)
        if block is None:
            raise AllocatorOutOfMemory(
                f"tried to allocate {segment_size(size)} bytes with {self.reserved_bytes} reserved "
                f"({self.allocated_bytes} allocated) and a limit of {self.limit_bytes} bytes",
                nbytes,
            )
        remaining = block.size - size
        if (remaining >= MIN_BLOCK) if small or self.expandable else (remaining > SMALL_REQUEST):
            rest = Block(block.address + size, remaining, small, prev=block, next=block.next)
            if block.next is not None:
                block.next.prev = rest
            block.next, block.size = rest, size
            self._blocks.insert(rest)
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
        self._blocks.insert(self._blocks.merged(block))

    def empty_cache(self) -> None:
        """Give back every segment with nothing allocated in it (``torch.cuda.empty_cache``); with
        expandable segments, every page that free blocks wholly cover."""
        for small in (True, False):
            if self._expandable is not None:
                self.reserved_bytes -= self._expandable.unmap_free(small)
                continue
            for _, _, block in [entry for entry in self._blocks.free[small] if not entry[2].split]:
                self._blocks.remove(block)
                del self._blocks.heads[block.address]
                self.reserved_bytes -= block.size

    def reset_peaks(self) -> None:
        self.peak_allocated_bytes, self.peak_reserved_bytes = self.allocated_bytes, self.reserved_bytes

    def layout(self) -> tuple[tuple[int, tuple[tuple[int, BlockState], ...]], ...]:
        """Every segment's address and its blocks' sizes and states, in address order: equal
        layouts place every later request alike (``torch.cuda.memory_snapshot``'s content). With
        expandable segments, the small pool's and the large pool's, each up to its last mapped
        block (an address of 0 where the pool has none)."""
        if self._expandable is not None:
            return self._expandable.layout()
        heads = self._blocks.heads
        return tuple((address, tuple(listed(heads[address]))) for address in sorted(heads))

    def segments(self) -> Segments:
        """Every segment's blocks (sizes and states), in address order, the addresses left out:
        equal ``segments()`` place every later request alike."""
        return tuple(blocks for _, blocks in self.layout())

    def _add_segment(self, blocks: tuple[tuple[int, BlockState], ...], small: bool) -> None:
        """A segment of ``blocks`` (sizes and states) at a new address, as ``starting_from`` lists it."""
        previous: Block | None = None
        address = self._blocks.new_address()
        if self._expandable is not None:
            self._expandable.bases[small] = address
        for size, state in blocks:
            block = Block(address, size, small, bool(state), prev=previous, mapped=state is not None)
            if previous is None:
                self._blocks.heads[address] = block
            else:
                previous.next = block
            if not block.mapped:
                self._blocks.unmapped[small].append((address, block))
            else:
                if block.allocated:
                    self.allocated_bytes += size
                else:
                    self._blocks.insert(block)
                self.reserved_bytes += size
            previous, address = block, address + size

    def _best_fit(self, size: int, small: bool) -> Block | None:
        pool = self._blocks.free[small]
        index = bisect.bisect_left(pool, (size, -1))
        if index == len(pool):
            return None
        if self.expandable:
            # A block that can grow into unmapped space counts as that far-reaching: the next one
            # in the size order is taken where it reaches less far (CUDA's expandable_size).
            while index + 1 < len(pool) and reach(pool[index + 1][2]) < reach(pool[index][2]):
                index += 1
        return pool.pop(index)[2]

    def _grow(self, size: int, small: bool) -> Block | None:
        """A free block of at least ``size`` made from new memory, out of its pool's free list; None
        where the cap does not allow what a new segment would take."""
        need = segment_size(size)
        if self.limit_bytes is not None and self.reserved_bytes + need > self.limit_bytes:
            return None
        if self._expandable is not None:
            block, mapped = self._expandable.grow(size, small)
            self._add_reserved(mapped)
            return block
        block = Block(self._blocks.new_address(), need, small)
        self._blocks.heads[block.address] = block
        self._add_reserved(need)
        return block

    def _add_reserved(self, nbytes: int) -> None:
        self.reserved_bytes += nbytes
        self.peak_reserved_bytes = max(self.peak_reserved_bytes, self.reserved_bytes)

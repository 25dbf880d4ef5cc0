"""PyTorch's CUDA caching allocator, modelled: where each block lands, what is reserved, when it retries.

The rules of ``c10/cuda/CUDACachingAllocator.cpp`` at its defaults (no ``max_split_size_mb``, no
rounding to powers of two), with or without expandable segments. Sizes round up to 512 bytes; requests up to
1 MiB share 2 MiB segments (the small pool), requests up to 10 MiB take 20 MiB segments, larger
ones a segment of their own rounded up to 2 MiB (the large pool). A request takes the smallest free
block of its pool that holds it (ties by address) and splits off the rest when what remains is at
least 512 bytes (small pool) or more than 1 MiB (large pool). A freed block merges with free
neighbours of its segment. With no free block, a new segment is taken if the reserved total stays
within the limit (``set_per_process_memory_fraction``); else every wholly free segment is given
back and the request tried once more (an allocator retry), and past that it is out of memory.

With ``expandable_segments:True`` (``PYTORCH_CUDA_ALLOC_CONF``) each pool is one segment of address
space that grows by pages (2 MiB for the small pool, 20 MiB for the large), mapped as needed. With
no free block that holds a request, the allocator maps the pages it lacks at the lowest address
where free and unmapped space together hold it (a free block just before an unmapped stretch
grows into it), so the pages of a block freed anywhere serve a request of any size once they are
unmapped. The cap is checked before mapping, against what a new segment would take (the request's
``segment_size``), though only whole pages are mapped: what is reserved may pass the cap by less
than a page. The best fit passes over a free block that could grow into unmapped space where a
block further in the size order reaches less far; any remainder of 512 bytes or more is split
off, in both pools. Freeing the cache (``empty_cache``, and before the retry) unmaps every page
that free blocks wholly cover.

Torch-free: the CPU stand-in for a GPU (``runtime.devices.caching_device``) drives it with the
real allocations of the real model, so the CUDA device's logic (reserved peaks, retries,
fragmentation over steps) runs where there is no GPU.
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


class AllocatorOutOfMemory(Exception):
    """A request (of ``nbytes``) the modelled allocator cannot place within its limit, even after
    freeing its cache."""

    def __init__(self, message: str, nbytes: int = 0) -> None:
        super().__init__(message)
        self.nbytes = nbytes


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


class CachingAllocator:
    """One device's caching allocator. ``limit_bytes`` caps what it reserves (None: no cap);
    ``expandable``: with expandable segments (see the module's docstring).

    Statistics as ``torch.cuda.memory_stats`` keeps them: allocated and reserved bytes now and at
    their peaks since ``reset_peaks``, and ``retries`` (``num_alloc_retries``).
    """

    def __init__(self, limit_bytes: int | None = None, expandable: bool = False) -> None:
        self.limit_bytes = limit_bytes
        self.expandable = expandable
        self.allocated_bytes = self.reserved_bytes = 0
        self.peak_allocated_bytes = self.peak_reserved_bytes = 0
        self.retries = 0
        self._free: dict[bool, list[tuple[int, int, Block]]] = {True: [], False: []}  # by size, address
        self._unmapped: dict[bool, list[tuple[int, Block]]] = {True: [], False: []}  # by address
        self._segments: dict[int, Block] = {}  # address -> first block of each segment
        self._bases: dict[bool, int] = {}  # an expandable pool's segment: where its address space begins
        self._addresses = itertools.count(start=1 << 48, step=1 << 48)  # segments never overlap

    @classmethod
    def starting_from(
        cls, segments: Segments, limit_bytes: int | None = None, expandable: bool = False
    ) -> CachingAllocator:
        """An allocator whose segments are ``segments`` (as ``segments()`` lists them): the state a
        trial starts from, its resident blocks allocated and the rest of their segments free."""
        allocator = cls(limit_bytes, expandable)
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
            previous: Block | None = None
            address = next(allocator._addresses)
            if expandable:
                allocator._bases[small] = address
            for size, state in blocks:
                block = Block(address, size, small, bool(state), prev=previous, mapped=state is not None)
                if previous is None:
                    allocator._segments[address] = block
                else:
                    previous.next = block
                if not block.mapped:
                    allocator._unmapped[small].append((address, block))
                    previous, address = block, address + size
                    continue
                if block.allocated:
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
        self._insert(self._merged(block))

    def empty_cache(self) -> None:
        """Give back every segment with nothing allocated in it (``torch.cuda.empty_cache``); with
        expandable segments, every page that free blocks wholly cover."""
        for small in (True, False):
            if self.expandable:
                for _, _, block in list(self._free[small]):
                    self._unmap(block)
                continue
            for _, _, block in [entry for entry in self._free[small] if not entry[2].split]:
                self._remove(block)
                del self._segments[block.address]
                self.reserved_bytes -= block.size

    def reset_peaks(self) -> None:
        self.peak_allocated_bytes, self.peak_reserved_bytes = self.allocated_bytes, self.reserved_bytes

    def layout(self) -> tuple[tuple[int, tuple[tuple[int, BlockState], ...]], ...]:
        """Every segment's address and its blocks' sizes and states, in address order: equal
        layouts place every later request alike (``torch.cuda.memory_snapshot``'s content). With
        expandable segments, the small pool's and the large pool's, each up to its last mapped
        block (an address of 0 where the pool has none)."""
        if self.expandable:
            pools = []
            for small in (True, False):
                base = self._bases.get(small)
                blocks = [] if base is None else self._blocks_from(self._segments[base])
                while blocks and blocks[-1][1] is None:
                    blocks.pop()  # the address space past the last mapped block
                pools.append((base or 0, tuple(blocks)))
            return tuple(pools)
        return tuple(
            (address, tuple(self._blocks_from(self._segments[address]))) for address in sorted(self._segments)
        )

    def segments(self) -> Segments:
        """Every segment's blocks (sizes and states), in address order, the addresses left out:
        equal ``segments()`` place every later request alike."""
        return tuple(blocks for _, blocks in self.layout())

    @staticmethod
    def _blocks_from(head: Block) -> list[tuple[int, BlockState]]:
        blocks: list[tuple[int, BlockState]] = []
        block: Block | None = head
        while block is not None:
            blocks.append((block.size, block.allocated if block.mapped else None))
            block = block.next
        return blocks

    def _best_fit(self, size: int, small: bool) -> Block | None:
        pool = self._free[small]
        index = bisect.bisect_left(pool, (size, -1))
        if index == len(pool):
            return None
        if self.expandable:
            # A block that can grow into unmapped space counts as that far-reaching: the next one
            # in the size order is taken where it reaches less far (CUDA's expandable_size).
            while index + 1 < len(pool) and _reach(pool[index + 1][2]) < _reach(pool[index][2]):
                index += 1
        return pool.pop(index)[2]

    def _grow(self, size: int, small: bool) -> Block | None:
        """A free block of at least ``size`` made from new memory, out of its pool's free list; None
        where the cap does not allow what a new segment would take."""
        need = segment_size(size)
        if self.limit_bytes is not None and self.reserved_bytes + need > self.limit_bytes:
            return None
        if not self.expandable:
            block = Block(next(self._addresses), need, small)
            self._segments[block.address] = block
            self._add_reserved(need)
            return block
        candidate = self._room(size, small)
        if not candidate.mapped:
            candidate = self._map(candidate, min(candidate.size, size))
        while candidate.size < size:  # a free block, then unmapped space: map what it lacks
            assert candidate.next is not None and not candidate.next.mapped
            candidate = self._map(candidate.next, min(size - candidate.size, candidate.next.size))
        self._remove(candidate)
        return candidate

    def _room(self, size: int, small: bool) -> Block:
        """The lowest place in the pool's expandable segment where free and unmapped blocks in a
        row hold ``size`` (its first block: unmapped, or free just before unmapped space)."""
        if small not in self._bases:
            base = next(self._addresses)
            whole = Block(base, VIRTUAL_BYTES, small, mapped=False)
            self._bases[small], self._segments[base] = base, whole
            self._unmapped[small].append((base, whole))
        current: Block | None
        for _, unmapped in self._unmapped[small]:
            first = unmapped
            if first.prev is not None and first.prev.mapped and not first.prev.allocated:
                first = first.prev
            room, current = 0, first
            while room < size and current is not None and not current.allocated:
                room, current = room + current.size, current.next
            if room >= size:
                return first
        raise AssertionError("an expandable segment's address space holds any request")

    def _map(self, block: Block, nbytes: int) -> Block:
        """Map the pages that hold the first ``nbytes`` of unmapped ``block``; the mapped block,
        merged with its free neighbours and in its pool's free list."""
        page = SMALL_PAGE if block.small else LARGE_PAGE
        mapped = min(block.size, -(-nbytes // page) * page)
        self._unmapped[block.small].remove((block.address, block))
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
            bisect.insort(self._unmapped[block.small], (rest.address, rest), key=lambda entry: entry[0])
        block.mapped = True
        self._add_reserved(mapped)
        merged = self._merged(block)
        self._insert(merged)
        return merged

    def _unmap(self, block: Block) -> None:
        """Unmap the pages that free ``block`` wholly covers; what is left of it stays free."""
        page = SMALL_PAGE if block.small else LARGE_PAGE
        base = self._bases[block.small]
        start, end = block.address - base, block.address - base + block.size
        first, last = -(-start // page) * page, end // page * page
        if first >= last:
            return
        self._remove(block)
        if first > start:
            before = Block(block.address, first - start, block.small, prev=block.prev, next=block)
            self._link(before)
            self._insert(before)
        if end > last:
            after = Block(base + last, end - last, block.small, prev=block, next=block.next)
            self._link(after)
            self._insert(after)
        block.address, block.size, block.mapped = base + first, last - first, False
        self.reserved_bytes -= last - first
        merged = self._merged(block)
        bisect.insort(self._unmapped[block.small], (merged.address, merged), key=lambda entry: entry[0])

    def _link(self, block: Block) -> None:
        """Splice ``block`` between its ``prev`` and ``next``."""
        if block.prev is None:
            self._segments[block.address] = block
        else:
            block.prev.next = block
        if block.next is not None:
            block.next.prev = block

    def _merged(self, block: Block) -> Block:
        """``block`` merged with its neighbours in its state (free, or unmapped), taken out of their
        lists; it keeps the lowest address."""
        for neighbour in (block.prev, block.next):
            if neighbour is None or neighbour.allocated or neighbour.mapped != block.mapped:
                continue
            if neighbour.mapped:
                self._remove(neighbour)
            else:
                self._unmapped[neighbour.small].remove((neighbour.address, neighbour))
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
        return block

    def _add_reserved(self, nbytes: int) -> None:
        self.reserved_bytes += nbytes
        self.peak_reserved_bytes = max(self.peak_reserved_bytes, self.reserved_bytes)

    def _insert(self, block: Block) -> None:
        bisect.insort(self._free[block.small], (block.size, block.address, block))

    def _remove(self, block: Block) -> None:
        pool = self._free[block.small]
        index = bisect.bisect_left(pool, (block.size, block.address))
        if index == len(pool) or pool[index][2] is not block:
            raise ValueError(f"block at {block.address:#x} is not in its free pool")
        del pool[index]


def _reach(block: Block) -> int:
    """How large a free block can grow without a new place: itself and the unmapped space after it."""
    following = block.next
    return block.size + (following.size if following is not None and not following.mapped else 0)

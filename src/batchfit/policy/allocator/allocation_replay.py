"""A caching allocator's verdict at any batch size, forecast from two recorded trials.

A trial's requests to the allocator are the same at every batch size, in the same order; only
their sizes change, each along a straight line in the batch (an activation of ``n`` samples is
``n`` times one sample's, a weight's gradient does not grow). Two trials that recorded their
requests (``policy.allocator.allocation_record``) at two batch sizes give each request's line.
``AllocationReplay`` plays the requests at the sizes of another batch on the modelled allocator
(``policy.allocator.caching_allocator``), from the state the trials started in and under the trial's cap,
and says whether they are placed: fragmentation and segment sizes included, which a line through
the allocated peaks cannot see. Its last recorded step is the steady state: it is played again,
each repetition freeing what the one before handed on, up to the trial's steps or until the
allocator's state recurs (after which the steps repeat steps played, as ``policy.allocator.steady`` argues).

Torch-free: the devices record (``runtime.devices.caching_device``), the search consults the
forecast (``policy.search.replay_forecast``) to place its real trials, and only real trials decide.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from batchfit.policy.allocator.allocation_record import ALLOC, AllocationRecord, AllocatorEvent
from batchfit.policy.allocator.allocator_blocks import Block, Segments
from batchfit.policy.allocator.caching_allocator import AllocatorOutOfMemory, CachingAllocator
from batchfit.policy.allocator.record_alignment import (
    align,
    frees_are_valid,
    handed_on,
    request_groups,
    request_kinds,
    requests_in,
)


@dataclass(frozen=True)
class Played:
    """A replay's verdict at one batch size, with the modelled allocator's peaks."""

    fits: bool
    peak_allocated_bytes: int
    peak_reserved_bytes: int


class AllocationReplay:
    """The requests of two aligned records, played at any batch size (see the module's docstring)."""

    def __init__(
        self,
        start: Segments,
        steps: tuple[tuple[AllocatorEvent, ...], ...],
        lines: list[tuple[float, float]],
        expandable: bool = False,
        places: tuple[int, ...] = (),
    ):
        self.start, self.steps, self.expandable = start, steps, expandable
        self.places = places  # the segments' order in addresses, as the reference recorded it
        self.lines = lines  # each request's bytes: intercept, bytes per sample
        self.handed_on = handed_on(steps, lines)
        self.transient = request_kinds(steps)[1]  # the workspaces: freed right after they are made

    @classmethod
    def of(cls, first: AllocationRecord, second: AllocationRecord) -> AllocationReplay | None:
        """The replay of two records at different batch sizes; None where they do not align.

        The record at the larger batch (else the other, if only that aligns) gives the steps and
        the start. Two differences are allowed. The other record may have made requests it never
        freed beyond the reference's: what a workload makes once, at its first use (a GradScaler's
        scale, cuBLAS's workspace), which later trials start with in place; those are left out. And
        either may have requests made and freed with nothing else between that the other lacks (the
        other's are left out): a kernel's workspace alone, not requested at all where the chosen
        algorithm needs none, takes the line through nothing at the other's batch; a reduction's
        staging buffer and its semaphores, requested where a reduction is long enough to be split
        over blocks (PyTorch's ``Reduce.cuh``), take the line through nothing at no batch for the
        buffer (its outputs times the blocks each is split over, which grow with the reduced
        length, the batch) and their sizes for the semaphores (one a block of outputs).
        Any other difference (a request or a free more, a free out of place, records of an allocator
        with expandable segments and of one without) leaves them unaligned.
        """
        if first.batch_size == second.batch_size or len(first.steps) != len(second.steps):
            return None
        if first.expandable != second.expandable:  # recorded on two kinds of allocator
            return None
        if not frees_are_valid(first.steps) or not frees_are_valid(second.steps):
            return None
        larger, smaller = sorted((first, second), key=lambda record: -record.batch_size)
        for reference, other in ((larger, smaller), (smaller, larger)):
            matched = align(reference.steps, other.steps)
            if matched is not None:
                break
        else:
            return None
        sizes = [value for events in reference.steps for kind, value in events if kind == ALLOC]
        other_sizes = [value for events in other.steps for kind, value in events if kind == ALLOC]
        span = reference.batch_size - other.batch_size
        scratch, groups = request_kinds(reference.steps)[2], request_groups(reference.steps)
        lines: list[tuple[float, float]] = []
        for ordinal, size in enumerate(sizes):
            match = matched[ordinal]
            if match is None and ordinal in scratch:  # a staging buffer (a group's first), semaphores
                lines.append((0.0, size / reference.batch_size) if ordinal in groups else (size, 0.0))
                continue
            slope = (size - (0 if match is None else other_sizes[match])) / span
            lines.append((size - slope * reference.batch_size, slope))
        return cls(reference.start, reference.steps, lines, reference.expandable, reference.places)

    @property
    def repeatable(self) -> bool:
        """Whether the last step can be played again: what it frees of earlier steps matches, request
        for request, what it hands on to the next."""
        return self.handed_on is not None

    def fits(
        self, batch_size: int, limit_bytes: int, steps: int, soft_workspaces: bool = False
    ) -> bool | None:
        """Whether ``steps`` steps at ``batch_size`` are placed under ``limit_bytes``; None where the
        records cannot say (more steps than recorded, and the last cannot be played again). With
        ``soft_workspaces``, a request freed right after it is made (a workspace) that cannot be
        placed is done without, as cuDNN does: it catches the allocator's failure (after the
        allocator has emptied its cache) and runs an algorithm that needs less."""
        played = self.play(batch_size, limit_bytes, steps, soft_workspaces)
        return None if played is None else played.fits

    def play(
        self, batch_size: int, limit_bytes: int | None, steps: int, soft_workspaces: bool = False
    ) -> Played | None:
        """``fits``, with the allocator's allocated and reserved peaks over the steps played (to the
        failure, where they fail); ``limit_bytes`` None plays them uncapped."""
        recorded = len(self.steps) - 1
        if steps > recorded and not self.repeatable:
            return None
        sizes = [max(1, math.ceil(fixed + slope * batch_size)) for fixed, slope in self.lines]
        allocator = CachingAllocator.starting_from(self.start, limit_bytes, self.expandable, self.places)
        player = _Player(allocator, sizes)
        if soft_workspaces:
            player.soft = self.transient
        blocks: dict[int, Block | None] = {}
        ordinal = 0
        try:
            for events in self.steps[: steps + 1]:
                for kind, value in events:
                    if kind == ALLOC:
                        blocks[ordinal] = player.request(ordinal)
                        ordinal += 1
                    else:
                        player.release(blocks.pop(value))
            if steps > recorded:
                self._repeat(player, blocks, steps - recorded)
            fits = True
        except AllocatorOutOfMemory:
            fits = False
        return Played(fits, allocator.peak_allocated_bytes, allocator.peak_reserved_bytes)

    def _repeat(self, player: _Player, blocks: dict[int, Block | None], times: int) -> bool:
        """Play the last step ``times`` more times, each freeing what the one before handed on; stop
        early (placed) once the allocator's state after a step recurs: the rest repeat steps played."""
        assert self.handed_on is not None
        last = self.steps[-1]
        first = requests_in(self.steps[:-1])  # the last step's first request
        inherited = {freed: index for index, (freed, _) in enumerate(self.handed_on)}
        seen = {player.allocator.segments()}
        current = {ordinal: block for ordinal, block in blocks.items() if ordinal >= first}
        for _ in range(times):
            fresh: dict[int, Block | None] = {}
            ordinal = first
            for kind, value in last:
                if kind == ALLOC:
                    fresh[ordinal] = player.request(ordinal)
                    ordinal += 1
                elif value >= first:
                    player.release(fresh[value])
                else:  # freed of the step before: the block that step handed on in its place
                    player.release(current[self.handed_on[inherited[value]][1]])
            current = fresh
            state = player.allocator.segments()
            if state in seen:
                return True
            seen.add(state)
        return True


class _Player:
    """Places a replay's requests at their sizes; a soft one that does not fit is done without."""

    def __init__(self, allocator: CachingAllocator, sizes: list[int]) -> None:
        self.allocator, self.sizes = allocator, sizes
        self.soft: set[int] = set()  # the requests that may fail without failing the step

    def request(self, ordinal: int) -> Block | None:
        try:
            return self.allocator.malloc(self.sizes[ordinal])
        except AllocatorOutOfMemory:
            if ordinal in self.soft:
                return None
            raise

    def release(self, block: Block | None) -> None:
        if block is not None:
            self.allocator.free(block)

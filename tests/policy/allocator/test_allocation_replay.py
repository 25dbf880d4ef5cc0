"""The replay of recorded allocator requests at other batch sizes, against brute force: random
training-like programs run on the modelled allocator at every size, step after step."""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

import pytest

from batchfit.policy.allocator.allocation_record import ALLOC, FREE, AllocationRecord, Recording
from batchfit.policy.allocator.allocation_replay import AllocationReplay
from batchfit.policy.allocator.allocator_blocks import Block
from batchfit.policy.allocator.caching_allocator import AllocatorOutOfMemory, CachingAllocator
from batchfit.policy.search.replay_forecast import ReplayForecast
from batchfit.policy.search.trial_records import TrialRecords

KiB, MiB = 1 << 10, 1 << 20


@dataclass(frozen=True)
class Program:
    """A training step's requests: weights resident before, optimizer state made at the first step;
    the forward's activations, with the last step's gradients freed among them (gradient ``i``
    before activation ``zero_at[i]``: set to None as each is reached); the backward's gradients,
    each followed by some activations freed (in ``frees`` order, ``freed_after[i]`` of them after
    gradient ``i``). Where the old gradients are freed amid the new requests, the layout moves
    from step to step, as it does on a GPU."""

    weights: tuple[int, ...]
    state: tuple[int, ...]
    activations: tuple[tuple[int, int], ...]  # bytes: fixed, per sample
    zero_at: tuple[int, ...]
    frees: tuple[int, ...]
    freed_after: tuple[int, ...]
    gradients: tuple[int, ...]
    once: tuple[int, int, bool] | None = None  # at step 1, before activation i: bytes, freed at its end?
    # Before activation i, at every step: a workspace of ``per_sample x (batch - from)`` bytes, made
    # and freed at once, and not requested at all where that is not positive.
    workspace: tuple[int, int, int] | None = None  # i, per_sample, from
    # Before activation i, at every step from ``from`` samples on: a reduction split over blocks, its
    # staging buffer of ``per_sample x batch`` bytes and a 16-byte semaphore made and freed together.
    scratch: tuple[int, int, int] | None = None  # i, per_sample, from
    expandable: bool = False  # the allocator's segments: expandable, or CUDA's default

    def start(self) -> tuple[CachingAllocator, list[Block]]:
        allocator = CachingAllocator(expandable=self.expandable)
        return allocator, [allocator.malloc(size) for size in self.weights]

    def run(
        self,
        batch_size: int,
        steps: int,
        limit: int | None,
        recording: Recording | None = None,
        soft_workspace: bool = False,
    ) -> int | None:
        """Run ``steps`` steps on a fresh allocator capped at ``limit``: the bytes it reserved at
        most, or None where a request could not be placed."""
        allocator, _ = self.start()
        allocator.limit_bytes = limit
        held: dict[Block, int] = {}

        def malloc(nbytes: int) -> Block:
            block = allocator.malloc(nbytes)
            if recording is not None:
                held[block] = recording.alloc(nbytes)
            return block

        def free(block: Block) -> None:
            allocator.free(block)
            if recording is not None:
                recording.free(held.pop(block))

        gradients: list[Block] = []
        try:
            for step in range(1, steps + 1):
                if recording is not None:
                    recording.mark_step()
                live: list[Block] = []
                made: list[Block] = []
                for index, (fixed, per_sample) in enumerate(self.activations):
                    if self.workspace is not None and self.workspace[0] == index:
                        needed = self.workspace[1] * (batch_size - self.workspace[2])
                        if needed > 0:
                            try:
                                free(malloc(needed))
                            except AllocatorOutOfMemory:
                                if not soft_workspace:  # cuDNN runs an algorithm that needs less
                                    raise
                    scratch = self.scratch
                    if scratch is not None and scratch[0] == index and batch_size >= scratch[2]:
                        buffer = malloc(scratch[1] * batch_size)
                        free(malloc(16))  # the semaphores, freed before the buffer
                        free(buffer)
                    if step == 1 and self.once is not None and self.once[0] == index:
                        made.append(malloc(self.once[1]))
                    for block, at in zip(gradients, self.zero_at, strict=False):  # none at the first step
                        if at == index:
                            free(block)
                    live.append(malloc(fixed + per_sample * batch_size))
                frees = list(self.frees)
                gradients = []
                for size, count in zip(self.gradients, self.freed_after, strict=True):
                    gradients.append(malloc(size))
                    for _ in range(count):
                        free(live[frees.pop(0)])
                for index in frees:
                    free(live[index])
                if self.once is not None and self.once[2]:  # freed at the step's end
                    for block in made:
                        free(block)
                if step == 1:
                    for size in self.state:
                        malloc(size)
        except AllocatorOutOfMemory:
            return None
        return allocator.peak_reserved_bytes

    def record(self, batch_size: int, steps: int) -> AllocationRecord:
        allocator, _ = self.start()
        recording = Recording(allocator.segments(), self.expandable)
        assert self.run(batch_size, steps, None, recording) is not None
        record = recording.record(batch_size)
        assert record is not None
        return record


def random_program(seed: int) -> Program:
    rng = random.Random(seed)

    def size() -> int:  # small-pool, mid-sized and large requests alike
        return rng.choice(
            [rng.randrange(1, 64 * KiB), rng.randrange(MiB, 4 * MiB), rng.randrange(6 * MiB, 12 * MiB)]
        )

    def per_sample() -> int:
        return rng.choice([0, rng.randrange(1, 32 * KiB), rng.randrange(64 * KiB, 512 * KiB)])

    activations = tuple((rng.randrange(0, 256 * KiB), per_sample()) for _ in range(rng.randrange(3, 12)))
    frees = list(range(len(activations)))
    rng.shuffle(frees)
    gradients = tuple(size() for _ in range(rng.randrange(1, 5)))
    freed_after = [0] * len(gradients)
    for _ in frees:
        freed_after[rng.randrange(len(gradients))] += 1
    return Program(
        gradients,  # the weights, whose gradients have their sizes
        tuple(rng.choice(gradients) for _ in range(rng.randrange(0, 4))),
        activations,
        tuple(rng.randrange(len(activations)) for _ in gradients),
        tuple(frees),
        tuple(freed_after),
        gradients,
    )


@pytest.mark.parametrize("expandable", [False, True], ids=["segments", "expandable"])
@pytest.mark.parametrize("seed", range(40))
def test_the_replay_of_two_records_places_every_size_as_the_program_itself_does(
    seed: int, expandable: bool
) -> None:
    program = replace(random_program(seed), expandable=expandable)
    replay = AllocationReplay.of(program.record(2, 2), program.record(4, 2))
    assert replay is not None and replay.repeatable
    # Caps at what 8 and 64 samples reserve over 10 steps; sizes from half to twice that.
    for limit_at in (8, 64):
        limit = _reserved(program, limit_at)
        for batch_size in range(limit_at // 2, 2 * limit_at + 1, max(1, limit_at // 16)):
            for steps in (1, 2, 10):
                expected = program.run(batch_size, steps, limit) is not None
                assert replay.fits(batch_size, limit, steps) == expected, (batch_size, steps)


def test_some_programs_fit_two_steps_and_not_ten() -> None:
    # What makes the replay play the last step again: the layout moves over the steps.
    moved = [
        (seed, batch_size)
        for seed in range(40)
        for limit_at in (8, 64)
        for batch_size in range(limit_at // 2, 2 * limit_at + 1, max(1, limit_at // 16))
        if (program := random_program(seed)).run(batch_size, 2, limit := _reserved(program, limit_at))
        is not None
        and program.run(batch_size, 10, limit) is None
    ]
    assert len(moved) >= 2


def _reserved(program: Program, batch_size: int) -> int:
    """What ``batch_size`` reserves at its peak over 10 steps, uncapped: a cap it just fits."""
    peak = program.run(batch_size, 10, None)
    assert peak is not None
    return peak


def test_the_forecast_finds_the_boundary_a_real_search_would() -> None:
    program = random_program(3)
    limit = _reserved(program, 50)
    records = TrialRecords({2: program.record(2, 2), 4: program.record(4, 2)})
    forecast = ReplayForecast(records, limit, 10)
    truth = max(n for n in range(1, 200) if program.run(n, 10, limit) is not None)
    assert forecast.fits(truth) is True and forecast.fits(truth + 1) is False
    assert ReplayForecast(TrialRecords({2: records[2]}), limit, 10).fits(truth) is None  # one record: no line


@pytest.mark.parametrize("seed", range(8))
def test_a_record_near_the_boundary_brings_the_requests_the_opening_lacks(seed: int) -> None:
    # A workspace that batches 2 and 4 do not request (an algorithm that larger batches take): the
    # replay of the opening's records overshoots the boundary. A confirming trial's record (10
    # steps) just below it has the workspace: paired with the record at 4, which keeps the line's
    # span wide, the replay places the boundary as the program does.
    plain = random_program(seed)
    program = replace(plain, workspace=(seed % len(plain.activations), 3 * MiB, 5))
    limit = _reserved(program, 32)
    truth = max(n for n in range(1, 80) if program.run(n, 10, limit) is not None)
    records = TrialRecords({2: program.record(2, 2), 4: program.record(4, 2)})
    forecast = ReplayForecast(records, limit, 10)
    assert forecast.evidence() == (2, 4) and forecast.fits(truth + 1) is True  # overshoots
    records.add(program.record(truth - 2, 10))  # added as the search runs
    assert forecast.evidence() == (4, truth - 2)
    assert forecast.fits(truth) is True and forecast.fits(truth + 1) is False


def test_the_pair_is_the_largest_record_and_the_largest_at_most_half_its_size_that_aligns() -> None:
    program = random_program(3)
    records = TrialRecords({size: program.record(size, 2) for size in (2, 4, 6, 9, 30)})
    forecast = ReplayForecast(records, 1 << 40, 10)
    assert forecast.evidence() == (9, 30)
    records.add(program.record(20, 2))
    assert forecast.evidence() == (9, 30)  # 20 is more than half of 30: the span would be narrow
    for size in (9, 6, 4, 2):
        records.discard(size)
    assert forecast.evidence() == (20, 30)  # none at most half: the nearest below
    # A largest record that aligns with none (another program's) leaves the pair below it.
    records.join({2: program.record(2, 2), 4: program.record(4, 2)})
    records.add(replace(random_program(4), workspace=None).record(30, 2))
    assert forecast.evidence() == (4, 20)
    # A size recorded again (a trial run again) makes a new replay of the new record.
    records.add(program.record(20, 3))
    replay = forecast.replay()
    assert replay is not None and replay.steps == program.record(20, 3).truncated(2).steps


def test_records_that_do_not_align_give_no_replay() -> None:
    program = random_program(5)
    two, four = program.record(2, 2), program.record(4, 2)
    assert AllocationReplay.of(two, two) is None  # one batch size: no line
    other_steps = AllocationRecord(4, four.start, (*four.steps[:-1], four.steps[-1][:-1]))
    assert AllocationReplay.of(two, other_steps) is None  # a request fewer
    assert AllocationReplay.of(two, program.record(4, 3)) is None  # another number of steps
    # A request more, freed at the step's end: another code path, not something made once.
    assert AllocationReplay.of(replace(program, once=(0, 64, True)).record(2, 2), four) is None
    # The same requests, recorded on an allocator with expandable segments: another allocator.
    expandable = replace(program, expandable=True)
    assert expandable.record(4, 2).steps == four.steps
    assert AllocationReplay.of(two, expandable.record(4, 2)) is None
    assert AllocationReplay.of(expandable.record(2, 2), expandable.record(4, 2)) is not None


def test_expandable_segments_move_the_boundary_the_replay_places() -> None:
    # The two allocators place the same requests differently: of the random programs' boundaries
    # (caps at what 8 and 64 samples reserve), most move with expandable segments, either way
    # (their pages come back from anywhere; their cap counts a whole new segment, and maps 20 MiB).
    moved = []
    for seed in range(20):
        program = random_program(seed)
        for limit_at in (8, 64):
            limit = _reserved(program, limit_at)
            plain, grown = (
                max((n for n in range(1, 4 * limit_at) if variant.run(n, 10, limit) is not None), default=0)
                for variant in (program, replace(program, expandable=True))
            )
            moved.append(grown - plain)
    assert sum(1 for change in moved if change > 0) >= 10 and any(change < 0 for change in moved)


def test_requests_made_once_by_the_first_trial_are_left_out() -> None:
    # The first trial makes what a workload makes at its first use and keeps (a GradScaler's scale,
    # cuBLAS's workspace) amid its first step: the replay is the later trial's, every other
    # request on the line it has without them.
    program = random_program(11)
    four = program.record(4, 2)
    plain = AllocationReplay.of(program.record(2, 2), four)
    for at in range(len(program.activations)):
        made_once = AllocationReplay.of(replace(program, once=(at, 4, False)).record(2, 2), four)
        assert plain is not None and made_once is not None
        assert (made_once.lines, made_once.steps, made_once.start) == (plain.lines, four.steps, four.start)


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize(("per_sample", "start"), [(3 * MiB, 2), (-5 * MiB, 3)], ids=["from-4", "up-to-2"])
def test_a_workspace_requested_at_one_size_only_still_aligns(seed: int, per_sample: int, start: int) -> None:
    # A kernel's workspace, made and freed at once, that one record has and the other lacks (an
    # algorithm that needs none at 2 samples, or at 4): its line goes through nothing where it was
    # not requested, and the replay places every size as the program does.
    plain = random_program(seed)
    program = replace(plain, workspace=(seed % len(plain.activations), per_sample, start))
    two, four = program.record(2, 2), program.record(4, 2)
    assert two.steps != four.steps  # one has the workspace, the other not
    replay = AllocationReplay.of(two, four)
    assert replay is not None and replay.repeatable and replay.steps == four.steps  # the larger's
    limit = _reserved(program, 32)
    for batch_size in range(4, 65, 4):
        for steps in (2, 10):
            expected = program.run(batch_size, steps, limit) is not None
            assert replay.fits(batch_size, limit, steps) == expected


def test_a_reduction_s_staging_buffer_from_one_size_on_grows_with_the_batch() -> None:
    # A reduction long enough to be split over blocks (PyTorch's Reduce.cuh) requests a staging
    # buffer and its semaphores, made and freed together, from some batch on: the record at 8 has
    # them, the one at 4 not. The buffer goes on the line through nothing at no batch, the
    # semaphores keep their size, and the replay places every size from 8 on as the program does.
    decided = 0
    for seed in range(8):
        plain = random_program(seed)
        program = replace(plain, scratch=(seed % len(plain.activations), 512 * KiB, 8))
        four, eight = program.record(4, 2), program.record(8, 2)
        assert four.steps != eight.steps
        replay = AllocationReplay.of(four, eight)
        assert replay is not None and replay.repeatable and replay.steps == eight.steps
        limit = _reserved(program, 64)
        for batch_size in range(8, 129, 4):
            for steps in (2, 10):
                expected = program.run(batch_size, steps, limit) is not None
                # Not a workspace: the step fails where the buffer is not placed.
                assert replay.fits(batch_size, limit, steps, soft_workspaces=True) == expected
                decided += expected != (plain.run(batch_size, steps, limit) is not None)
    assert decided > 0  # the buffer decided somewhere


@pytest.mark.parametrize("seed", range(8))
def test_a_workspace_that_cannot_be_placed_is_done_without_where_the_device_says_so(seed: int) -> None:
    # On CUDA, cuDNN catches the allocator's failure for a workspace and runs an algorithm that
    # needs less: near the cap the step fits without it. The replay follows either rule.
    program = replace(random_program(seed), workspace=(0, 6 * MiB, 0))
    replay = AllocationReplay.of(program.record(2, 2), program.record(4, 2))
    assert replay is not None
    limit = _reserved(replace(program, workspace=None), 24)  # enough for all but the workspace
    differ = 0
    for batch_size in range(4, 49, 2):
        for soft in (False, True):
            expected = program.run(batch_size, 10, limit, soft_workspace=soft) is not None
            assert replay.fits(batch_size, limit, 10, soft_workspaces=soft) == expected
        differ += replay.fits(batch_size, limit, 10, True) != replay.fits(batch_size, limit, 10, False)
    assert differ > 0  # the workspace decided somewhere


def test_a_last_step_that_hands_on_other_blocks_than_it_freed_is_not_repeated() -> None:
    # One step: it frees nothing of an earlier step, yet keeps its gradients; past it, no forecast.
    program = random_program(7)
    replay = AllocationReplay.of(program.record(2, 1), program.record(4, 1))
    assert replay is not None and not replay.repeatable
    assert replay.fits(8, 1 << 40, 1) is True
    assert replay.fits(8, 1 << 40, 2) is None


def test_a_free_of_a_block_requested_before_the_recording_spoils_it() -> None:
    recording = Recording(())
    first = recording.alloc(100)
    recording.free(first)
    assert recording.record(2) == AllocationRecord(2, (), (((ALLOC, 100), (FREE, 0)),))
    recording.free(None)
    assert recording.record(2) is None


@pytest.mark.parametrize("expandable", [False, True], ids=["segments", "expandable"])
def test_an_allocator_started_from_segments_places_requests_as_the_original(expandable: bool) -> None:
    rng = random.Random(0)
    original = CachingAllocator(expandable=expandable)
    blocks = [
        original.malloc(rng.choice([rng.randrange(1, MiB), rng.randrange(MiB, 30 * MiB)])) for _ in range(40)
    ]
    for block in rng.sample(blocks, 25):
        original.free(block)
    if expandable:
        original.empty_cache()  # unmapped space among the blocks
        assert any(state is None for blocks in original.segments() for _, state in blocks)
    copy = CachingAllocator.starting_from(original.segments(), expandable=expandable)
    assert copy.segments() == original.segments()
    assert (copy.allocated_bytes, copy.reserved_bytes) == (original.allocated_bytes, original.reserved_bytes)
    for _ in range(60):
        nbytes = rng.choice([rng.randrange(1, MiB), rng.randrange(MiB, 30 * MiB)])
        original.malloc(nbytes)
        copy.malloc(nbytes)
        assert copy.segments() == original.segments()

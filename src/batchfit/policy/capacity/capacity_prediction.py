"""The largest batch on a GPU of another size, from a few small trials' allocator requests: the
requests replayed on the modelled caching allocator (``policy.allocator.allocation_replay``) under the
target's
budget, the batch searched by galloping and bisection, and a band from what the replay cannot know.

The target's budget is ``memory_fraction x (total - context) - reserve``: the caching allocator may
reserve what the card's memory leaves beside the CUDA context, the share ``find`` would use, less
what the user keeps back. The band is the batch searched at the budget's two ends: the card's total
and its context each a range (``policy.capacity.cards``), the parts the replay does not model (each a number
of the budget either way, named), and, where three or more trials were recorded, the answer of the pair
below the largest (the replay's own error, seen on the recorded points). Torch-free.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from batchfit.policy.allocator.allocation_record import AllocationRecord
from batchfit.policy.allocator.allocation_replay import AllocationReplay, Played
from batchfit.policy.allocator.allocator_blocks import Segments, rounded, segment_size
from batchfit.policy.capacity.cards import CONTEXT_BYTES, CONTEXT_HIGH_BYTES, CONTEXT_LOW_BYTES, Card
from batchfit.policy.search.replay_forecast import ReplayForecast
from batchfit.policy.search.search_state import Candidates
from batchfit.policy.search.trial_records import TrialRecords


@dataclass(frozen=True)
class Memory:
    """A target's memory: its total as torch reports it (a range) and the context's (a range)."""

    name: str
    total_bytes: int
    total_high_bytes: int
    context_bytes: int
    context_low_bytes: int
    context_high_bytes: int

    @classmethod
    def of_card(cls, card: Card) -> Memory:
        return cls(
            card.name,
            card.total_bytes,
            card.total_high_bytes,
            card.context_bytes,
            card.context_low_bytes,
            card.context_high_bytes,
        )

    @classmethod
    def of_capacity(cls, name: str, total_bytes: int, context: bool = True) -> Memory:
        """A capacity given in bytes (the card's total); ``context=False``: nothing beside the
        allocator (the CPU standing in for a GPU has no context)."""
        if not context:
            return cls(name, total_bytes, total_bytes, 0, 0, 0)
        return cls(name, total_bytes, total_bytes, CONTEXT_BYTES, CONTEXT_LOW_BYTES, CONTEXT_HIGH_BYTES)

    def budgets(self, memory_fraction: float, reserve_bytes: int) -> tuple[int, int, int]:
        """The allocator's budget: as estimated, at its lowest and at its highest."""

        def budget(total: int, context: int) -> int:
            return max(0, int(memory_fraction * (total - context)) - reserve_bytes)

        return (
            budget(self.total_bytes, self.context_bytes),
            budget(self.total_bytes, self.context_high_bytes),
            budget(self.total_high_bytes, self.context_low_bytes),
        )


@dataclass(frozen=True)
class Unmodelled:
    """A part of the step on CUDA the replay does not model: what it is, and the share of the
    budget it may move the step's memory by, either way (``measured``: False where that is a guess)."""

    part: str
    share: float
    measured: bool = False


@dataclass(frozen=True)
class CapacityPrediction:
    """The largest batch predicted on one target, in one mode, with its band and evidence."""

    target: str
    budget_bytes: int
    batch_size: int | None  # None: not even the smallest candidate is placed
    band: tuple[int | None, int | None]
    peak_allocated_bytes: int | None  # the replay's, at ``batch_size`` under the budget
    peak_reserved_bytes: int | None
    at_max_batch_size: bool  # the largest candidate was placed: the card holds more
    pairs: tuple[tuple[int, int], ...]  # the recorded sizes each answer came from, primary first

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def largest_placed(fits: Callable[[int], bool], candidates: Candidates) -> int | None:
    """The largest candidate below the first failure, galloping up from the first and bisecting:
    None where the first fails. ``fits`` is a replay (any number of calls is cheap)."""
    if not fits(candidates.first):
        return None
    placed, index = 0, 1
    while index < candidates.count and fits(candidates.batch(index)):
        placed, index = index, index * 2
    failed = min(index, candidates.count)
    while failed - placed > 1:
        middle = (placed + failed) // 2
        if fits(candidates.batch(middle)):
            placed = middle
        else:
            failed = middle
    return candidates.batch(placed)


class CapacityPredictor:
    """Predicts from ``records`` (recorded trials that fitted, by batch size) at any budget: the
    replay of the pair ``find``'s forecast would take (``ReplayForecast``), at ``steps`` steps;
    ``kept_bytes``: requests CUDA makes once and keeps that the records lack (cuBLAS's workspace
    where the records come from the CPU), placed before the trials' start."""

    def __init__(
        self,
        records: Mapping[int, AllocationRecord],
        steps: int,
        soft_workspaces: bool = False,
        kept_bytes: tuple[int, ...] = (),
    ) -> None:
        self.steps, self.soft_workspaces = steps, soft_workspaces
        records = {size: _with_kept(record, kept_bytes) for size, record in records.items()}
        self.replays: list[tuple[tuple[int, int], AllocationReplay]] = []
        # The pair find would replay, then (the replay's own error) the pair below the largest.
        for chosen in (records, {size: records[size] for size in sorted(records)[:-1]}):
            forecast = ReplayForecast(TrialRecords(chosen), 0, steps, soft_workspaces)
            pair, replay = forecast.evidence(), forecast.replay()
            if pair is not None and replay is not None and pair not in [p for p, _ in self.replays]:
                self.replays.append((pair, replay))
        if not self.replays:
            raise ValueError(f"no two of the records at {sorted(records)} align: nothing to replay")

    def play(self, batch_size: int, budget_bytes: int | None) -> Played:
        played = self.replays[0][1].play(batch_size, budget_bytes, self.steps, self.soft_workspaces)
        if played is None:
            raise ValueError(f"the records cannot be played for {self.steps} steps")
        return played

    def predict(
        self,
        memory: Memory,
        candidates: Candidates,
        memory_fraction: float = 0.8,
        reserve_bytes: int = 0,
        unmodelled: tuple[Unmodelled, ...] = (),
    ) -> CapacityPrediction:
        budget, low, high = memory.budgets(memory_fraction, reserve_bytes)
        widened = sum(int(part.share * budget) for part in unmodelled)
        low, high = max(0, low - widened), high + widened
        answer = self.largest(budget, candidates)
        ends = [
            self._largest(replay, limit, candidates) for _, replay in self.replays for limit in (low, high)
        ]
        placed = [end for end in [answer, *ends] if end is not None]
        band = (
            None if None in ends else min(placed, default=None),
            max(placed, default=None),
        )
        peaks = self.play(answer, budget) if answer is not None else None
        return CapacityPrediction(
            target=memory.name,
            budget_bytes=budget,
            batch_size=answer,
            band=band,
            peak_allocated_bytes=None if peaks is None else peaks.peak_allocated_bytes,
            peak_reserved_bytes=None if peaks is None else peaks.peak_reserved_bytes,
            at_max_batch_size=answer == candidates.batch(candidates.count - 1),
            pairs=tuple(pair for pair, _ in self.replays),
        )

    def largest(self, budget_bytes: int, candidates: Candidates) -> int | None:
        """The largest candidate the primary pair's replay places under ``budget_bytes``."""
        return self._largest(self.replays[0][1], budget_bytes, candidates)

    def _largest(self, replay: AllocationReplay, budget: int, candidates: Candidates) -> int | None:
        return largest_placed(
            lambda size: bool(replay.fits(size, budget, self.steps, self.soft_workspaces)), candidates
        )


def _with_kept(record: AllocationRecord, kept_bytes: tuple[int, ...]) -> AllocationRecord:
    """``record`` starting with a segment of its own for each of ``kept_bytes`` (allocated): what
    CUDA holds from its first use on, which the trials did not request."""
    if not kept_bytes or record.expandable:  # an expandable pool is one segment: not modelled
        return record
    added: Segments = tuple(_segment(nbytes) for nbytes in kept_bytes)
    return AllocationRecord(record.batch_size, record.start + added, record.steps, record.expandable)


def _segment(nbytes: int) -> tuple[tuple[int, bool], ...]:
    size = rounded(nbytes)
    total = segment_size(size)
    return ((size, True),) if total == size else ((size, True), (total - size, False))

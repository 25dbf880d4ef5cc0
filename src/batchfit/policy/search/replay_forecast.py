"""The search's forecast behind a caching allocator: which two recorded trials to replay, and the
replay's verdict at a batch size."""

from __future__ import annotations

from batchfit.policy.allocator.allocation_record import AllocationRecord
from batchfit.policy.allocator.allocation_replay import AllocationReplay, Played
from batchfit.policy.search.safe_band import MAX_REPLAYED
from batchfit.policy.search.trial_records import TrialRecords


class ReplayForecast:
    """The search's ``FitForecast`` on a caching allocator: the replay of two recorded trials that
    fitted (``records``, which the search's trial runners add to as they run: the opening's, then
    the confirming trials' that fitted), at ``steps`` steps under the trial's cap of
    ``limit_bytes`` (``soft_workspaces``: the device's kernels do without a workspace the allocator
    cannot place, as cuDNN's do).

    The pair is the largest record and, below it, the largest record at most half its size that
    aligns with it (else the nearest below that does; else the next largest record and so on).
    The larger carries the requests of a batch near the boundary, which small batches may not make
    (a request of its own, another algorithm's workspaces); the smaller keeps the span of the line
    wide, so that a size rounded in both stays a small error in its slope. The longer trial's record
    is cut to the shorter's steps; the replay plays its last step again as before.
    """

    def __init__(
        self,
        records: TrialRecords,
        limit_bytes: int,
        steps: int,
        soft_workspaces: bool = False,
        low: int | None = None,
    ) -> None:
        self.records, self.limit_bytes, self.steps = records, limit_bytes, steps
        self.soft_workspaces, self.low = soft_workspaces, low
        # The largest size asked that the replay places although a size below it fails: a larger
        # answer the band below it does not hold (``SafeBand.isolated``, by the replay alone).
        self.above: int | None = None
        # Each verdict played, by the pair it was played on, the batch size and the cap.
        self._played: dict[tuple[tuple[int, int], int, int], Played | None] = {}
        # Each pair's replay, with the records it was made of (a size recorded again makes a new one).
        self._replays: dict[
            tuple[int, int], tuple[AllocationRecord, AllocationRecord, AllocationReplay | None]
        ] = {}
        self.replays_run = 0

    def evidence(self) -> tuple[int, int] | None:
        """The batch sizes of the pair of records the forecast replays (None: no pair aligns)."""
        sizes = sorted(self.records)
        for reference in reversed(sizes):
            below = [size for size in sizes if size < reference]
            half = [size for size in below if size <= reference // 2]
            for other in half[::-1] + [size for size in below if size > reference // 2][::-1]:
                if self._replay(other, reference) is not None:
                    return other, reference
        return None

    def replay(self) -> AllocationReplay | None:
        pair = self.evidence()
        return None if pair is None else self._replay(*pair)

    def _replay(self, smaller: int, larger: int) -> AllocationReplay | None:
        first, second = self.records[smaller], self.records[larger]
        cached = self._replays.get((smaller, larger))
        if cached is None or cached[0] is not first or cached[1] is not second:  # new, or recorded again
            steps = min(len(first.steps), len(second.steps)) - 1
            replay = AllocationReplay.of(first.truncated(steps), second.truncated(steps))
            cached = self._replays[(smaller, larger)] = (first, second, replay)
        return cached[2]

    def fits(self, batch_size: int) -> bool | None:
        """Whether ``batch_size`` is placed under the cap and, with ``low``, every size from ``low``
        below it too (at most ``MAX_REPLAYED`` of them): the search then aims at the top of the band
        that holds every smaller batch the run will see (``policy.search.safe_band``)."""
        played = self.play(batch_size, self.limit_bytes)
        if played is None or not played.fits or self.low is None:
            return None if played is None else played.fits
        for size in range(batch_size - 1, max(self.low, batch_size - MAX_REPLAYED) - 1, -1):
            below = self.play(size, self.limit_bytes)
            if below is not None and not below.fits:
                self.above = max(self.above or 0, batch_size)
                return False
        return True

    def play(self, batch_size: int, limit_bytes: int) -> Played | None:
        """The replay at ``batch_size`` under ``limit_bytes`` (another budget than the search's),
        with its peaks; None where no pair aligns or the records cannot be played that far. Each
        size is played once on each pair."""
        pair = self.evidence()
        if pair is None:
            return None
        key = (pair, batch_size, limit_bytes)
        if key not in self._played:
            self.replays_run += 1
            self._played[key] = self._replay(*pair).play(  # type: ignore[union-attr]
                batch_size, limit_bytes, self.steps, self.soft_workspaces
            )
        return self._played[key]

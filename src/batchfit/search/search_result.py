"""``SearchResult``: the answer of a memory search and the evidence for it, with its summary."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

from batchfit.policy.search.safe_band import SafeBand
from batchfit.policy.search.search import SearchStopReason
from batchfit.policy.search.search_account import trials_account
from batchfit.policy.search.trial import MemoryModel, Mode, Trial
from batchfit.result import stamped
from batchfit.runtime.devices.oom import fragmented
from batchfit.units import format_bytes, format_count


@dataclass(frozen=True)
class SearchResult:
    """The answer of a search and the evidence for it."""

    mode: Mode
    batch_size: int
    peak_bytes: int  # measured peak of the answer's trial
    budget_bytes: int  # memory_fraction x capacity_bytes
    capacity_bytes: int
    memory_fraction: float
    device: str
    trials: tuple[Trial, ...]  # real trials, in the order they ran
    predicted_trials: tuple[Trial, ...]  # fake-tensor traces that placed them (CPU devices)
    memory_model: MemoryModel | None
    stop_reason: SearchStopReason
    search_seconds: float
    min_batch_size: int
    max_batch_size: int
    multiple_of: int | None
    steps_per_trial: int
    confirm_steps: int | None  # the answer trained this many steps before it was final (CUDA)
    world_size: int = 1  # ranks that searched in lockstep; the capacity is the smallest one's
    replays: int = 0  # sizes the opening's allocator requests were replayed at, to place the trials
    compiled: tuple[str, ...] = ()  # what of the workload runs torch.compile'd code, measured as it runs
    wrapper_bytes: int = 0  # held beside the model in every trial: a DistributedDataParallel's buckets
    # The bytes of each bucket DDP rebuilds them into, which the training trials rebuilt them into in
    # step 2, as DDP does (behind a caching allocator; ``runtime.distributed.buckets``); empty: none.
    rebuilt_buckets: tuple[int, ...] = ()
    # Why no fake-tensor forecast placed the trials on a CPU device ("" where one did, or on CUDA).
    forecast_skipped: str = ""
    # Where a saved prediction's records placed the first trial (find --start-from), or None.
    started_from: int | None = None
    # Every size from band.low up to the answer checked to fit (behind a caching allocator, where
    # which sizes fit is not monotone); None where the device's memory grows with the batch.
    band: SafeBand | None = None

    command: ClassVar[str] = "find"

    def to_dict(self) -> dict[str, Any]:
        return stamped(self.command, asdict(self))

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    def table(self) -> str:
        """The trials in the order they ran, one line each, as the command prints them as they run."""
        return "".join(trial.line(self.mode) + "\n" for trial in self.trials)

    def summary(self) -> str:
        why = {
            "boundary": "the next larger candidate did not fit",
            "max_batch_size": f"max_batch_size={self.max_batch_size} was reached",
            "smaller_size_failed": "a smaller batch failed below the search's larger answer",
        }.get(self.stop_reason, self.stop_reason)
        traced = (
            f" (placed by {format_count(len(self.predicted_trials), 'fake-tensor trace')})"
            if self.predicted_trials
            else f" (placed by replaying the allocator's requests at {format_count(self.replays, 'size')})"
            if self.replays
            else ""
        )
        ranks = f", the smallest of {self.world_size} ranks" if self.world_size > 1 else ""
        if self.wrapper_bytes:
            ranks += f", DDP's gradient buckets of {format_bytes(self.wrapper_bytes)} held"
        if self.rebuilt_buckets:
            rebuilt = format_count(len(self.rebuilt_buckets), "bucket")
            ranks += f" and rebuilt into {rebuilt} in step 2, as DDP does"
        answer = self.answer
        confirmed = f", the answer confirmed over {self.confirm_steps} steps" if self.confirm_steps else ""
        if confirmed and answer.steady_from is not None:
            confirmed += (
                f" (to step {answer.steps}, where the allocator's state repeated its state after step "
                f"{answer.steady_from}: the steps after would repeat steps that ran)"
            )
        retries = answer.allocator_retries
        retried = (
            f" Its steps needed {retries} allocator retries under the cap (the allocator freed its "
            f"cache to go on, which costs time); a smaller batch may train faster."
            if retries
            else ""
        )
        compiled = (
            f" The step runs torch.compile'd code ({', '.join(self.compiled)}), measured as it runs"
            + (", from the CPU allocator's events." if self.device.startswith("cpu") else ".")
            if self.compiled
            else ""
        )
        unforecast = (
            f" No fake-tensor forecast placed the trials: {self.forecast_skipped}."
            if self.forecast_skipped
            else ""
        )
        if self.started_from is not None:
            unforecast += (
                f" The first trial was at batch_size={self.started_from}, where the saved prediction put it."
            )
        unforecast += self._trials_needed()
        return (
            f"{self.mode}: batch_size={self.batch_size} (peak {format_bytes(self.peak_bytes)} of a "
            f"{format_bytes(self.budget_bytes)} budget = {self.memory_fraction:g} x "
            f"{format_bytes(self.capacity_bytes)} on {self.device}{ranks}); "
            f"{format_count(len(self.trials), 'trial')}"
            f"{traced}{confirmed} in {self.search_seconds:.2f} s; stopped because {why}."
            f"{self._fragmentation()}{retried}{compiled}{unforecast}{self._band()}"
        )

    def _band(self) -> str:
        """What the check below the answer found: the band that fits, and the larger answer that
        sizes below it put at risk, with what makes it safe."""
        band = self.band
        if band is None:
            return ""
        reached = (
            ""
            if band.whole
            else f" by the replay, which reached {band.checked_to} (below it nothing was checked)"
        )
        trials = ", ".join(map(str, band.confirmed_at))
        confirmed = f", confirmed by real trials at {trials}" if band.confirmed_at else ""
        if band.isolated is None:
            return (
                f" Every batch from {band.low} to {self.batch_size} fits{reached}: replayed at "
                f"{format_count(band.replayed, 'size')}{confirmed}."
            )
        failing = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in band.failing)
        held = (
            f"every batch from {band.low} to {band.high} fits{reached}, replayed at "
            f"{format_count(band.replayed, 'size')}{confirmed}, so the answer is {band.high}"
            if band.high is not None
            else f"no size the search may answer lies from {band.low} below {band.failing[0][0]}, "
            f"so the answer stays {band.isolated}"
        )
        fits = (
            f"The replay places batch {band.isolated} too (no trial ran it)"
            if band.isolated_by_replay
            else f"Batch {band.isolated} fits"
        )
        needed = band.memory_fraction_for_isolated
        fraction = (
            "" if needed is None else f", or memory_fraction={needed:.2f}, where the replay places them all"
        )
        return (
            f" {fits}, but {failing} below it fail{'s' if failing.isdigit() else ''}: "
            f"{held}. At {band.isolated}, a last batch, an eval batch or a restart in {failing} runs out "
            f"of memory; to train at {band.isolated}, drop the last batch (drop_last=True) or pad it to "
            f"{band.isolated}, and pass must_fit_from={band.isolated}{fraction}."
        )

    def _fragmentation(self) -> str:
        """Where the next larger candidate ran out of memory with room in the allocator's cache, not
        in one piece: a sentence that says so (CUDA's allocator, or its model)."""
        above = [t for t in self.trials if t.outcome == "oom" and t.batch_size > self.batch_size]
        if self.stop_reason != "boundary" or not above:
            return ""
        nearest = min(above, key=lambda trial: trial.batch_size)
        found = fragmented(nearest.detail)
        if found is None:
            return ""
        asked, held = found
        return (
            f" Batch {nearest.batch_size} ran out of memory asking for {format_bytes(asked)} while the "
            f"allocator held {format_bytes(held)} reserved but unallocated: room, not in one piece "
            f"(fragmentation). Expandable segments may fit more: `batchfit compare --techniques "
            f"expandable-segments` measures them."
        )

    def _trials_needed(self) -> str:
        """From a saved prediction: the real trials the search still needed, and why (a sentence)."""
        account = trials_account(self.trials, self.batch_size, self.started_from)
        return f" {account[0].upper()}{account[1:]}" if account else ""

    @property
    def answer(self) -> Trial:
        """The last real trial at the answer: its peaks and allocator retries are the evidence."""
        return [trial for trial in self.trials if trial.batch_size == self.batch_size][-1]

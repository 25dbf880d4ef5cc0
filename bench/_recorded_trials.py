"""The trials ``bench/find_curves.py`` recorded near a case's boundary, as oracles a replayed search
asks: the short and confirming trial at each size (a size between two recorded ones that both fit
interpolated), what each took, and the allocator requests recorded."""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from batchfit.policy.allocator.allocation_record import AllocationRecord
from batchfit.policy.search.trial import Trial


class GapError(LookupError):
    """A size the recording cannot answer for: between a size that fitted and one that failed."""


@dataclass
class Recorded:
    """One case's trials, as oracles: ``short`` the search's trial, ``long`` the confirming one."""

    name: str
    cap: str
    budget_bytes: int
    max_batch_size: int
    confirm_steps: int | None
    sizes: list[int]
    shorts: dict[int, Trial]
    longs: dict[int, Trial]
    find_sizes: list[int]
    find_answer: int | None
    find_traces: int
    seconds: dict[tuple[int, bool], float] = field(default_factory=dict)  # (size, longer?): a trial's time
    modelled: set[int] = field(default_factory=set)  # sizes answered without a recorded trial
    # The requests of the opening's trials, and (recorded since 2026-11-26) of the confirming
    # trials that fitted near the boundary.
    records: dict[int, AllocationRecord] = field(default_factory=dict)
    soft_workspaces: bool = False  # as the recording device's kernels are (CUDA's cuDNN)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Recorded:
        points = sorted(data["points"], key=lambda point: point["batch_size"])
        return cls(
            data["name"],
            data["cap"],
            data["budget_bytes"],
            data["max_batch_size"],
            data["confirm_steps"],
            [point["batch_size"] for point in points],
            {point["batch_size"]: Trial(**point["short"]) for point in points},
            {point["batch_size"]: Trial(**point["long"]) for point in points if point["long"]},
            data["find_sizes"],
            data["find_answer"],
            data["find_traces"],
            {
                **{(p["batch_size"], False): p.get("short_seconds", 0.0) for p in points},
                **{(p["batch_size"], True): p.get("long_seconds") or 0.0 for p in points if p["long"]},
            },
            records={
                int(size): AllocationRecord.from_dict(record)
                for kind in ("records", "near_records")  # the opening's, the confirming trials'
                for size, record in data.get(kind, {}).items()
            },
            soft_workspaces=data.get("soft_workspaces", False),
        )

    def trial_seconds(self, trials: list[Trial], longer: list[Trial] | None = None) -> float:
        """What ``trials`` took when recorded (those in ``longer`` were confirming trials); an
        unrecorded one, what the nearest recorded size below it took with a trial of its kind."""
        total = 0.0
        for trial in trials:
            kind = any(trial is other for other in longer or ())
            times = sorted((size, t) for (size, long), t in self.seconds.items() if long == kind)
            below = [t for size, t in times if size <= trial.batch_size]
            total += below[-1] if below else (times[0][1] if times else 0.0)
        return total

    def short(self, batch_size: int) -> Trial:
        if batch_size in self.shorts:
            return self.shorts[batch_size]
        self.modelled.add(batch_size)
        at = bisect.bisect_left(self.sizes, batch_size)
        below = self.shorts[self.sizes[at - 1]] if at > 0 else None
        above = self.shorts[self.sizes[at]] if at < len(self.sizes) else None
        if below is not None and not below.fits:  # above a failure: it fails too
            return replace(below, batch_size=batch_size)
        if above is None:
            raise GapError(f"{self.name}: {batch_size} lies above every recorded size")
        if below is None or not above.fits:
            raise GapError(
                f"{self.name}: {batch_size} lies between {below and below.batch_size} and "
                f"{above.batch_size} ({above.outcome}); record a wider dense window"
            )
        share = (batch_size - below.batch_size) / (above.batch_size - below.batch_size)

        def between(low: int | None, high: int | None) -> int | None:
            return None if low is None or high is None else round(low + share * (high - low))

        return replace(
            below,
            batch_size=batch_size,
            peak_bytes=round(below.peak_bytes + share * (above.peak_bytes - below.peak_bytes)),
            optimizer_peak_bytes=between(below.optimizer_peak_bytes, above.optimizer_peak_bytes),
            activation_peak_bytes=between(below.activation_peak_bytes, above.activation_peak_bytes),
            reserved_peak_bytes=between(below.reserved_peak_bytes, above.reserved_peak_bytes),
        )

    def long(self, batch_size: int) -> Trial:
        """The confirming trial: recorded, or (unrecorded, where the short one fits, far below the
        boundary) the short one's measurement, taken to hold over the longer run."""
        if batch_size in self.longs:
            return self.longs[batch_size]
        trial = self.short(batch_size)
        self.modelled.add(batch_size)
        return replace(trial, steps=self.confirm_steps)

    def truth(self) -> int | None:
        """The largest recorded size whose trials fit. Under a caching allocator fitting need not
        be monotone in the batch (a size whose blocks fill the segments can fit where a smaller one
        leaves holes), so this is not the size below the first failure."""
        fitting = [
            size
            for size in self.sizes
            if self.shorts[size].fits and (size not in self.longs or self.longs[size].fits)
        ]
        return max(fitting, default=None)


def load(paths: list[Path]) -> list[Recorded]:
    return [Recorded.from_dict(curve) for path in paths for curve in json.loads(path.read_text())["curves"]]

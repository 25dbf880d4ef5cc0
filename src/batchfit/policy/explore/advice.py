"""What ``advise`` tells the user to change, free of torch: each change with its measured gain and
the command that shows the evidence, ranked by that gain; a speed-up within the measurements' noise
is not counted as one."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from batchfit.policy.explore.ratios import ratio_text, within_noise

#: A change is worth saying when it buys more than this share (explore's tolerance: within 3% of
#: the best is as fast).
MIN_GAIN = 0.03


@dataclass(frozen=True)
class Change:
    """One thing to change, with what it was measured to buy."""

    what: str  # "use amp (autocast bfloat16)"
    speedup: float | None  # samples/s after over before, measured; None when not measured
    batch_gain: float | None  # largest memory-safe batch after over before
    evidence: str  # the command that shows it ("batchfit compare --techniques amp")
    batch_gain_at_least: bool = False  # the larger batch reached the search's upper bound
    speedup_low: float | None = None  # the speed-up's 90% interval; None where not measured in pairs
    speedup_high: float | None = None
    clearly_slower: bool = False  # one step was several times the baseline's: a slow-down, not noise

    @property
    def within_noise(self) -> bool:
        """The speed-up's interval includes 1: the measurements cannot tell it from no change (a
        clear slow-down, measured in one step, never is)."""
        return not self.clearly_slower and within_noise(self.speedup_low, self.speedup_high)

    def line(self, context: str = "") -> str:
        """One line; ``context`` (the workload and device flags) completes the evidence command."""
        gains = []
        if self.speedup is not None:
            gains.append(ratio_text(self.speedup, self.speedup_low, self.speedup_high, " the throughput"))
        if self.batch_gain is not None:
            bound = "at least " if self.batch_gain_at_least else ""
            gains.append(f"{bound}{self.batch_gain:.2f}x the largest batch")
        evidence = f"{self.evidence} {context}".strip()
        return f"{self.what}: {', '.join(gains) or 'not measured'} (evidence: {evidence})"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def counted_speedup(change: Change) -> float | None:
    """The speed-up the ranking counts: 1 (no change) where it is within noise, else as measured."""
    return 1.0 if change.within_noise else change.speedup


def worth_saying(change: Change) -> bool:
    """It buys speed, or a larger batch without costing more than the tolerance in speed; a
    speed-up or slow-down within noise counts as none."""
    speedup = counted_speedup(change)
    faster = speedup is not None and speedup > 1 + MIN_GAIN
    larger = change.batch_gain is not None and change.batch_gain > 1 + MIN_GAIN
    not_slower = speedup is None or speedup >= 1 - MIN_GAIN
    return faster or (larger and not_slower)


def rank(changes: Iterable[Change]) -> tuple[Change, ...]:
    """The changes worth saying, the largest counted speed-up first, then the largest batch gain:
    a change whose speed-up is within noise ranks by its batch gain alone, after every real
    speed-up."""
    kept = [change for change in changes if worth_saying(change)]
    return tuple(
        sorted(kept, key=lambda change: (-(counted_speedup(change) or 1.0), -(change.batch_gain or 1.0)))
    )


def costly(changes: Iterable[Change]) -> tuple[Change, ...]:
    """The changes that buy a larger batch at a cost in speed beyond noise: worth knowing when
    memory, not speed, is what stops a run, never advised for speed."""
    return tuple(
        change
        for change in changes
        if change.batch_gain is not None
        and change.batch_gain > 1 + MIN_GAIN
        and (speedup := counted_speedup(change)) is not None
        and speedup < 1 - MIN_GAIN
    )


def noisy(changes: Iterable[Change]) -> tuple[Change, ...]:
    """The changes whose speed-up is within noise and that buy no larger batch worth saying:
    measured, but not shown to buy anything, so neither ``rank`` nor ``costly`` lists them."""
    return tuple(change for change in changes if change.within_noise and not worth_saying(change))


def slower(changes: Iterable[Change]) -> tuple[Change, ...]:
    """The changes clearly slower than the workload as given (one step several times the
    baseline's) that buy no larger batch: measured enough to say so, never advised."""
    return tuple(change for change in changes if change.clearly_slower and change not in costly([change]))

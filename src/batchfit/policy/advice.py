"""What ``advise`` tells the user to change, free of torch: each change with its measured gain and
the command that shows the evidence, ranked by that gain."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

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

    def line(self, context: str = "") -> str:
        """One line; ``context`` (the workload and device flags) completes the evidence command."""
        gains = []
        if self.speedup is not None:
            gains.append(f"{self.speedup:.2f}x the throughput")
        if self.batch_gain is not None:
            bound = "at least " if self.batch_gain_at_least else ""
            gains.append(f"{bound}{self.batch_gain:.2f}x the largest batch")
        evidence = f"{self.evidence} {context}".strip()
        return f"{self.what}: {', '.join(gains) or 'not measured'} (evidence: {evidence})"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def worth_saying(change: Change) -> bool:
    """It buys speed, or a larger batch without costing more than the tolerance in speed."""
    faster = change.speedup is not None and change.speedup > 1 + MIN_GAIN
    larger = change.batch_gain is not None and change.batch_gain > 1 + MIN_GAIN
    not_slower = change.speedup is None or change.speedup >= 1 - MIN_GAIN
    return faster or (larger and not_slower)


def rank(changes: Iterable[Change]) -> tuple[Change, ...]:
    """The changes worth saying, the largest speed-up first, then the largest batch gain."""
    kept = [change for change in changes if worth_saying(change)]
    return tuple(sorted(kept, key=lambda change: (-(change.speedup or 1.0), -(change.batch_gain or 1.0))))


def costly(changes: Iterable[Change]) -> tuple[Change, ...]:
    """The changes that buy a larger batch at a cost in speed: worth knowing when memory, not
    speed, is what stops a run, never advised for speed."""
    return tuple(
        change
        for change in changes
        if change.batch_gain is not None
        and change.batch_gain > 1 + MIN_GAIN
        and change.speedup is not None
        and change.speedup < 1 - MIN_GAIN
    )

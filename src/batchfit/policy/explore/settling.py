"""An exploration that ended before its measurements told the sizes apart, free of torch: which
sizes it measured, and about how much more timing would settle it (docs/explore.md, "Not
settled", explains the estimate)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from batchfit.policy.explore.choose import Objective, Recommendation, settles_with
from batchfit.policy.explore.throughput import Point
from batchfit.policy.explore.time_budget import NotMeasured

#: The most evidence the estimate weighs: up to this many times the windows timed so far.
MAX_EVIDENCE = 64


@dataclass(frozen=True)
class Effort:
    """What an exploration's timing cost, on the meter's clock."""

    seconds: float  # since the exploration started: what its time budget is read against
    timing_seconds: float  # in visits to batch sizes (warm-ups, untimed steps, windows)
    coarse_timed: tuple[tuple[int, float], ...]  # (batch size, seconds) of each coarse size timed
    coarse_left: tuple[int, ...]  # the coarse sizes the time budget left untimed

    @property
    def coarse_seconds(self) -> float:
        return sum(seconds for _, seconds in self.coarse_timed)


@dataclass(frozen=True)
class Aims:
    """What the exploration aims at, as its ``Rules`` say: what settling it means and costs."""

    tolerance: float
    objective: Objective
    confidence_target: int
    focus_time_factor: float  # the rounds' cap, in times the coarse pass


@dataclass(frozen=True)
class Unsettled:
    """Why an exploration's recommendation is a leaning, not an answer, and what would settle it."""

    confidence: int  # the recommendation's, under ``floor``
    floor: int
    leaning: int  # the size the rule leans to (the recommendation's batch_size)
    measured: tuple[int, ...]  # every size timed, smallest first
    more_seconds: float | None  # about this much more timing would settle it; None: not within
    # MAX_EVIDENCE times the timing so far (the sizes may sit at the tolerance's edge)
    budget_seconds: float | None  # the time budget that would then do: the time so far plus more_seconds
    how: str  # how more_seconds was estimated

    def line(self) -> str:
        """The sizes measured and what would settle them (the recommendation says it is unsettled)."""
        head = f"measured {', '.join(str(batch) for batch in self.measured)}"
        if self.more_seconds is None or self.budget_seconds is None:
            return f"{head}; {self.how}."
        return (
            f"{head}; about {math.ceil(self.more_seconds)} s more of timing would settle it "
            f"(time_budget_seconds about {math.ceil(self.budget_seconds)}): {self.how}."
        )

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "measured": list(self.measured)}


def unsettled(
    recommendation: Recommendation, points: Sequence[Point], effort: Effort, rules: Aims
) -> Unsettled | None:
    """None when ``recommendation`` is settled; else what was measured and what would settle it.

    While the coarse pass is unfinished, the rest of explore's own plan: the coarse sizes left,
    each at the seconds per sample of the smallest size timed (a visit's steps grow with the batch;
    that smaller sizes run fewer samples per second makes this a low estimate, but they are the
    cheap ones), then the rounds, at their cap of ``focus_time_factor`` times the coarse pass
    (often they stop sooner). Once every coarse size is timed: the fewest
    times the evidence (2, 4, ... up to ``MAX_EVIDENCE``) whose standard errors, shrunk by its
    square root, let the rule reach ``confidence_target``, at about that many times the timing so
    far.
    """
    if recommendation.settled:
        return None
    measured = tuple(sorted(point.batch_size for point in points))
    more: float | None
    if effort.coarse_left and effort.coarse_timed:  # the first coarse size is always timed
        more, how = _coarse_rest(effort, rules)
    else:
        more, how = _more_evidence(points, effort, rules)
    return Unsettled(
        confidence=recommendation.confidence,
        floor=recommendation.floor,
        leaning=recommendation.batch_size,
        measured=measured,
        more_seconds=more,
        budget_seconds=None if more is None else effort.seconds + more,
        how=how,
    )


def _coarse_rest(effort: Effort, rules: Aims) -> tuple[float, str]:
    smallest, seconds = min(effort.coarse_timed)
    per_sample = seconds / smallest
    left = sum(effort.coarse_left) * per_sample
    rounds = rules.focus_time_factor * (effort.coarse_seconds + left)
    how = (
        f"the {len(effort.coarse_left)} coarse sizes not timed yet, at the {1000 * per_sample:.1f} ms "
        f"per sample that {smallest} took, then rounds over the contenders of up to "
        f"{rules.focus_time_factor:g} times the coarse pass"
    )
    return left + rounds, how


def _more_evidence(points: Sequence[Point], effort: Effort, rules: Aims) -> tuple[float | None, str]:
    evidence = 2
    while evidence <= MAX_EVIDENCE:
        if settles_with(
            points,
            evidence,
            tolerance=rules.tolerance,
            objective=rules.objective,
            confidence_target=rules.confidence_target,
        ):
            how = (
                f"the spread measured so far needs about {evidence} times the windows to reach the "
                f"confidence target of {rules.confidence_target}, at about {evidence} times the "
                f"{effort.timing_seconds:.1f} s of timing so far"
            )
            return (evidence - 1) * effort.timing_seconds, how
        evidence *= 2
    how = (
        f"even {MAX_EVIDENCE} times the windows, at the spread measured so far, would not reach the "
        f"confidence target of {rules.confidence_target}: the leading sizes may sit at the edge of "
        f"the tolerance ({rules.tolerance:g}), where no amount of timing tells them apart; a wider "
        f"tolerance would"
    )
    return None, how


def left_out(effort: Effort, doubt: Unsettled | None, out_of_time: bool) -> tuple[NotMeasured, ...]:
    """What the time budget left unmeasured: each coarse size not timed, at the seconds per sample
    of the smallest size timed (``_coarse_rest``'s estimate), or, once they all were, the rounds
    that would settle the recommendation (``doubt``'s estimate). Empty unless ``out_of_time``."""
    if not out_of_time:
        return ()
    reason = "the time budget ran out"
    if effort.coarse_left and effort.coarse_timed:
        smallest, seconds = min(effort.coarse_timed)
        return tuple(
            NotMeasured(f"batch size {batch}", reason, batch * seconds / smallest)
            for batch in effort.coarse_left
        )
    if doubt is None:
        return ()
    return (NotMeasured("rounds over the contenders", f"{reason} before they settled", doubt.more_seconds),)

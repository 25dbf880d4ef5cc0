"""The throughput chooser, free of torch: which measured batch size to recommend, and how sure to be.

The estimates come from ``policy.explore.throughput``; the confidence is a parametric bootstrap around
them, and below ``CONFIDENCE_FLOOR`` the recommendation is not settled; docs/explore.md explains.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from batchfit.checks import Objective as Objective
from batchfit.checks import check_choice_rules
from batchfit.policy.explore.ratios import Ratio, of_estimates, ratio_text
from batchfit.policy.explore.throughput import Point, assess

#: Below this confidence (0-100) a recommendation is not settled: under 50 the size it leans to is
#: more likely outside the tolerance of the best than within, so the measurements have not told
#: the sizes apart, and it is reported as a leaning, not an answer. A ``confidence_target`` below
#: 50 lowers the floor to it: that target asks for the rule on less evidence.
CONFIDENCE_FLOOR = 50


@dataclass(frozen=True)
class Recommendation:
    batch_size: int  # the size recommended; while not ``settled``, the size the rule leans to
    best_batch_size: int  # the fastest measured
    base_batch_size: int
    speedup: float  # throughput of the recommendation over the base's
    confidence: int  # 0-100: bootstrap probability that the recommendation is within tolerance of the best
    speedup_low: float | None = None  # the speed-up's 90% interval; None when there is no spread
    speedup_high: float | None = None  # yet, or the recommendation is the base
    floor: int = CONFIDENCE_FLOOR  # the confidence below which it is not settled

    @property
    def settled(self) -> bool:
        """Whether the confidence reaches the floor: the measurements tell this size from the others."""
        return self.confidence >= self.floor

    def line(self) -> str:
        performance = ratio_text(self.speedup, self.speedup_low, self.speedup_high, " base")
        if not self.settled:
            return (
                f"No micro_batch_size settled: leaning to {self.batch_size}, estimated performance: "
                f"{performance}, confidence score: {self.confidence} (out of 100), below "
                f"{self.floor}: the measurements do not yet tell the sizes apart"
            )
        return (
            f"Current recommended micro_batch_size: {self.batch_size}, estimated performance: "
            f"{performance}, confidence score: {self.confidence} (out of 100)"
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def recommend(
    points: Sequence[Point],
    *,
    tolerance: float = 0.03,
    objective: Objective = "smallest-within-tolerance",
    base_batch_size: int | None = None,
    allowed: Callable[[int], bool] | None = None,
    confidence_target: int = 90,
    resamples: int = 400,
    seed: int = 0,
) -> Recommendation | None:
    """The recommendation from what has been measured so far; None when nothing allowed is measured.

    With the default objective: of the batch sizes within ``tolerance`` of the best, the smallest
    whose confidence reaches ``confidence_target``; while none does, the one most surely fast
    (the highest estimate less one standard error).
    """
    check_choice_rules(tolerance, objective, confidence_target)
    allowed = allowed or (lambda batch: True)
    medians, error = assess([point for point in points if point.samples_per_second])
    eligible = {batch: value for batch, value in medians.items() if allowed(batch)}
    if not eligible:
        return None
    top = max(eligible.values())
    best = min(batch for batch, value in eligible.items() if value == top)
    within = sorted(batch for batch, value in eligible.items() if value >= (1 - tolerance) * top)
    sure = (
        None
        if error is None
        else _confidences({b: medians[b] for b in eligible}, error, tolerance, resamples, seed)
    )
    if objective == "max-throughput":
        chosen = best
    elif sure is None or error is None:  # no spread measured yet: the rule on the medians alone
        chosen = within[0]
    else:
        confident = [batch for batch in within if sure[batch] >= confidence_target / 100]
        # Else the one most surely fast: the highest throughput less one standard error.
        chosen = (
            confident[0] if confident else max(within, key=lambda b: (medians[b] * math.exp(-error[b]), -b))
        )
    base = base_batch_size if base_batch_size in medians else min(medians)
    speedup = _speedup(medians, error, chosen, base)
    return Recommendation(
        batch_size=chosen,
        best_batch_size=best,
        base_batch_size=base,
        speedup=speedup.value,
        confidence=round(100 * sure[chosen]) if sure is not None else 0,
        speedup_low=speedup.low,
        speedup_high=speedup.high,
        floor=min(CONFIDENCE_FLOOR, confidence_target),
    )


def _speedup(medians: dict[int, float], error: dict[int, float] | None, chosen: int, base: int) -> Ratio:
    """``chosen``'s throughput over ``base``'s, with an interval where their errors are known."""
    if error is not None and chosen != base and medians[base] > 0:
        return of_estimates(medians[chosen], medians[base], error[chosen], error[base])
    return Ratio(medians[chosen] / medians[base] if medians[base] > 0 else 0.0)


def confidences(
    points: Sequence[Point], *, tolerance: float = 0.03, resamples: int = 400, seed: int = 0
) -> dict[int, float]:
    """Each measured batch size's chance (0-1) of being within ``tolerance`` of the best, as a
    recommendation's confidence is computed; empty while no spread is measured."""
    level, error = assess([point for point in points if point.samples_per_second])
    return {} if error is None else _confidences(level, error, tolerance, resamples, seed)


def settles_with(
    points: Sequence[Point],
    evidence: float,
    *,
    tolerance: float = 0.03,
    objective: Objective = "smallest-within-tolerance",
    confidence_target: int = 90,
    resamples: int = 400,
    seed: int = 0,
) -> bool:
    """Whether ``evidence`` times the windows, of the spread measured so far, would let the rule
    answer at ``confidence_target``: every standard error divided by ``sqrt(evidence)``, does a size
    within ``tolerance`` of the best (the best itself, for ``max-throughput``) reach it? False while
    no spread is measured."""
    medians, error = assess([point for point in points if point.samples_per_second])
    if error is None or not medians:
        return False
    shrunk = {batch: value / math.sqrt(evidence) for batch, value in error.items()}
    sure = _confidences(medians, shrunk, tolerance, resamples, seed)
    top = max(medians.values())
    if objective == "max-throughput":
        candidates = [min(batch for batch, value in medians.items() if value == top)]
    else:
        candidates = [batch for batch, value in medians.items() if value >= (1 - tolerance) * top]
    return any(sure[batch] >= confidence_target / 100 for batch in candidates)


def _confidences(
    medians: dict[int, float], error: dict[int, float], tolerance: float, resamples: int, seed: int
) -> dict[int, float]:
    """For each batch size, the share of redraws in which it is within ``tolerance`` of the
    redraw's best."""
    rng = random.Random(seed)  # private: the user's random state is left alone
    hits = dict.fromkeys(medians, 0)
    for _ in range(resamples):
        sample = {batch: value * math.exp(rng.gauss(0, 1) * error[batch]) for batch, value in medians.items()}
        bar = (1 - tolerance) * max(sample.values())
        for batch in medians:
            hits[batch] += sample[batch] >= bar
    return {batch: count / resamples for batch, count in hits.items()}

"""The throughput chooser, free of torch: which measured batch size to recommend, and how sure to be.

Round-to-round drift is divided out (a median polish on the logarithms), each estimate leans on
its measured neighbours, and the confidence is a parametric bootstrap; docs/explore.md explains.
"""

from __future__ import annotations

import math
import random
import statistics
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

from batchfit.errors import ConfigurationError

Objective = Literal["smallest-within-tolerance", "max-throughput"]
#: Pseudo-windows of the pooled spread added to each batch size's own (see _residual_noise).
_PRIOR_WINDOWS = 3.0
#: How far a throughput curve may stray from the straight line in log-log between two measured
#: neighbours (a standard deviation of logarithms; see _pooled).
_ROUGHNESS = 0.03


@dataclass(frozen=True)
class Point:
    """Throughput measured at one batch size: one value per timing window, and optionally the
    round in which each window was measured (windows of one round were taken close in time)."""

    batch_size: int
    samples_per_second: tuple[float, ...]
    rounds: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.rounds and len(self.rounds) != len(self.samples_per_second):
            raise ConfigurationError(
                f"batch size {self.batch_size}: {len(self.rounds)} round labels for "
                f"{len(self.samples_per_second)} windows; give one per window or none."
            )

    @property
    def median(self) -> float:
        return statistics.median(self.samples_per_second)

    @property
    def spread(self) -> float:
        """Relative spread of the windows: (max - min) / median."""
        values = self.samples_per_second
        return (max(values) - min(values)) / self.median if self.median > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "median": self.median, "spread": self.spread}


@dataclass(frozen=True)
class Recommendation:
    batch_size: int
    best_batch_size: int  # the fastest measured
    base_batch_size: int
    speedup: float  # throughput of the recommendation over the base's
    confidence: int  # 0-100: bootstrap probability that the recommendation is within tolerance of the best

    def line(self) -> str:
        return (
            f"Current recommended micro_batch_size: {self.batch_size}, estimated performance: "
            f"{self.speedup:.2f}x base, confidence score: {self.confidence} (out of 100)"
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def estimates(points: Sequence[Point], pooled: bool = True) -> dict[int, float]:
    """Each batch size's throughput, drift-corrected where the windows carry rounds: the median of
    its windows compared in shared rounds, weighed against those of any round of its own (which
    carry that round's drift); ``pooled``, also weighed against the line between its measured
    neighbours (see ``_pooled``)."""
    return _assess([point for point in points if point.samples_per_second], pool=pooled)[0]


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
    if not 0 <= tolerance < 1:
        raise ConfigurationError(f"tolerance={tolerance!r} must be in [0, 1), e.g. 0.03 for 3%.")
    if objective not in ("smallest-within-tolerance", "max-throughput"):
        raise ConfigurationError(
            f"objective={objective!r}: use 'smallest-within-tolerance' or 'max-throughput'."
        )
    if not 0 <= confidence_target <= 100:
        raise ConfigurationError(f"confidence_target={confidence_target!r} must be in [0, 100].")
    allowed = allowed or (lambda batch: True)
    medians, error = _assess([point for point in points if point.samples_per_second])
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
    elif sure is None:  # no spread measured yet: the rule on the medians alone
        chosen = within[0]
    else:
        confident = [batch for batch in within if sure[batch] >= confidence_target / 100]
        if confident:
            chosen = confident[0]
        else:  # the one most surely fast: the highest throughput less one standard error
            assert error is not None
            chosen = max(within, key=lambda batch: (medians[batch] * math.exp(-error[batch]), -batch))
    base = base_batch_size if base_batch_size in medians else min(medians)
    return Recommendation(
        batch_size=chosen,
        best_batch_size=best,
        base_batch_size=base,
        speedup=medians[chosen] / medians[base] if medians[base] > 0 else 0.0,
        confidence=round(100 * sure[chosen]) if sure is not None else 0,
    )


def confidences(
    points: Sequence[Point], *, tolerance: float = 0.03, resamples: int = 400, seed: int = 0
) -> dict[int, float]:
    """Each measured batch size's chance (0-1) of being within ``tolerance`` of the best, as a
    recommendation's confidence is computed; empty while no spread is measured."""
    level, error = _assess([point for point in points if point.samples_per_second])
    return {} if error is None else _confidences(level, error, tolerance, resamples, seed)


@dataclass
class _Fit:
    corrected: dict[int, list[float]]  # the windows with each fitted round's common factor divided out
    fitted: int  # how many round effects were fitted
    drift: float  # the round effects' spread (a standard deviation of logarithms); 0 when unknown
    # batch size -> its windows' logarithms (drift-corrected) in groups: those of shared rounds
    # first (an empty group when none), then one group per round of its own
    groups: dict[int, list[list[float]]]


def _corrected(points: Sequence[Point]) -> _Fit:
    """A median polish on the logarithms: a level per batch size plus an effect per round, fitted
    on the rounds that measured two batch sizes or more (one size alone cannot tell its level from
    its round's). Windows as measured, in one group each, when any lacks a round or a positive
    value."""
    raw = {point.batch_size: list(point.samples_per_second) for point in points}
    if not points or any(not point.rounds or min(point.samples_per_second) <= 0 for point in points):
        return _Fit(
            raw, 0, 0.0, {b: [[], [math.log(v) for v in values if v > 0]] for b, values in raw.items()}
        )
    logs = {
        point.batch_size: [
            (r, math.log(v)) for r, v in zip(point.rounds, point.samples_per_second, strict=True)
        ]
        for point in points
    }
    sizes_in_round: dict[int, set[int]] = defaultdict(set)
    for batch, pairs in logs.items():
        for r, _ in pairs:
            sizes_in_round[r].add(batch)
    shared = {r for r, sizes in sizes_in_round.items() if len(sizes) >= 2}
    # The polish runs on the shared rounds only: a window in a round of its own carries a drift
    # that nothing measured, and must not pull the level the round effects are fitted against.
    in_shared = {batch: [(r, v) for r, v in pairs if r in shared] for batch, pairs in logs.items()}
    level = {batch: statistics.median(v for _, v in pairs) for batch, pairs in in_shared.items() if pairs}
    effect: dict[int, float] = dict.fromkeys(sizes_in_round, 0.0)
    for _ in range(4):
        residuals: dict[int, list[float]] = defaultdict(list)
        for batch, pairs in in_shared.items():
            for r, value in pairs:
                residuals[r].append(value - level[batch] - effect[r])
        for r in shared:
            effect[r] += statistics.median(residuals[r])
        if shared:  # the typical shared round is the scale
            centre = statistics.median(effect[r] for r in shared)
            effect = {r: value - centre if r in shared else 0.0 for r, value in effect.items()}
        level = {
            batch: statistics.median(value - effect[r] for r, value in pairs)
            for batch, pairs in in_shared.items()
            if pairs
        }
    drift = math.sqrt(statistics.fmean(effect[r] ** 2 for r in shared)) if len(shared) >= 2 else 0.0
    groups: dict[int, list[list[float]]] = {}
    for batch, pairs in logs.items():
        own: dict[int, list[float]] = defaultdict(list)
        for r, value in pairs:
            if r not in shared:
                own[r].append(value)
        groups[batch] = [[value - effect[r] for r, value in pairs if r in shared], *own.values()]
    corrected = {batch: [math.exp(value - effect[r]) for r, value in pairs] for batch, pairs in logs.items()}
    return _Fit(corrected, len(shared), drift, groups)


def _assess(points: Sequence[Point], pool: bool = True) -> tuple[dict[int, float], dict[int, float] | None]:
    """Each batch size's throughput and its standard error (relative; None while no spread is
    measured).

    The windows of a batch size fall in groups: those compared in shared rounds (their drift taken
    out) and those of each round of its own. Each group's median has an error: 1.2533 x that of a
    mean of its windows, plus, for a round of its own, that round's drift, which the shared rounds
    measure (a batch size measured only on its own may have been measured in a fast or a slow
    spell). The estimate weighs the group medians by the inverse of their variances, so three
    windows in a lone spell count about as one compared window, not as three.
    """
    fit = _corrected(points)
    noise = _residual_noise(fit)
    if noise is None:
        plain = {batch: statistics.median(values) for batch, values in fit.corrected.items()}
        return plain, None
    levels, errors = {}, {}
    for batch, groups in fit.groups.items():
        weight = total = 0.0
        for index, group in enumerate(groups):
            if not group:
                continue
            variance = (1.2533 * noise[batch]) ** 2 / len(group) + (fit.drift**2 if index else 0.0)
            variance = max(variance, 1e-12)
            weight += 1 / variance
            total += statistics.median(group) / variance
        if weight:
            levels[batch], errors[batch] = math.exp(total / weight), 1 / math.sqrt(weight)
        else:  # no positive window (nothing got through): as measured, and known to be unsure
            levels[batch], errors[batch] = statistics.median(fit.corrected[batch]), 1.0
    return _pooled(levels, errors) if pool else (levels, errors)


def _pooled(levels: dict[int, float], errors: dict[int, float]) -> tuple[dict[int, float], dict[int, float]]:
    """Each batch size's estimate pooled with what its measured neighbours say of it.

    Throughput varies smoothly with the logarithm of the batch size, up to the bumps of kernel
    tiling (a few percent: ``_ROUGHNESS``). So the straight line in log-log between the two
    measured neighbours is a second estimate of a size's throughput, whose error is the
    neighbours' (weighed by the interpolation) plus that roughness; the two are weighed by the
    inverse of their variances. A size measured in few windows (a refinement added late) leans on
    its neighbours; one measured as often as they are hardly moves. The sizes at either end of the
    range are left as they are.
    """
    sizes = sorted(levels)
    pooled, pooled_errors = dict(levels), dict(errors)
    for low, batch, high in zip(sizes, sizes[1:], sizes[2:], strict=False):
        if min(levels[low], levels[batch], levels[high]) <= 0:
            continue
        share = math.log(batch / low) / math.log(high / low)
        line = (1 - share) * math.log(levels[low]) + share * math.log(levels[high])
        line_variance = _ROUGHNESS**2 + ((1 - share) * errors[low]) ** 2 + (share * errors[high]) ** 2
        own_variance = max(errors[batch] ** 2, 1e-12)
        variance = 1 / (1 / own_variance + 1 / line_variance)
        pooled[batch] = math.exp(variance * (math.log(levels[batch]) / own_variance + line / line_variance))
        pooled_errors[batch] = math.sqrt(variance)
    return pooled, pooled_errors


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


def _residual_noise(fit: _Fit) -> dict[int, float] | None:
    """Each batch size's relative window spread (a standard deviation of logarithms, about each
    group's median); None when no degrees of freedom are left.

    Short steps are noisier than long ones, so the spread is per batch size, shrunk towards the
    typical one (the median over batch sizes, which the noisiest do not drag up) by
    ``_PRIOR_WINDOWS`` pseudo-windows: three windows alone say little. The degrees of freedom that
    the fitted round effects took are taken from all batch sizes alike.
    """
    squares: dict[int, float] = {}
    degrees: dict[int, float] = {}
    for batch, groups in fit.groups.items():
        filled = [group for group in groups if group]
        squares[batch] = sum((value - statistics.median(group)) ** 2 for group in filled for value in group)
        degrees[batch] = float(sum(len(group) - 1 for group in filled))
    total = sum(degrees.values())
    kept = (total - max(0, fit.fitted - 1)) / total if total else 0.0
    if kept <= 0:
        return None
    typical = statistics.median(squares[b] / (degrees[b] * kept) for b in squares if degrees[b])
    return {
        b: math.sqrt((squares[b] + _PRIOR_WINDOWS * typical) / (degrees[b] * kept + _PRIOR_WINDOWS))
        for b in squares
    }

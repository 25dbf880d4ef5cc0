"""Throughput measured at batch sizes, and each size's estimate with its standard error, free of
torch: round-to-round drift divided out (a median polish on the logarithms), each estimate pooled
with its measured neighbours; docs/explore.md explains."""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from batchfit.errors import ConfigurationError

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
    def spread(self) -> float | None:
        """Relative spread of the windows: (max - min) / median; None for a single window, which
        has none (0 would read as a perfectly steady size)."""
        values = self.samples_per_second
        if len(values) < 2:
            return None
        return (max(values) - min(values)) / self.median if self.median > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "median": self.median, "spread": self.spread}


def estimates(points: Sequence[Point], pooled: bool = True) -> dict[int, float]:
    """Each batch size's throughput, drift-corrected where the windows carry rounds: the median of
    its windows compared in shared rounds, weighed against those of any round of its own (which
    carry that round's drift); ``pooled``, also weighed against the line between its measured
    neighbours (see ``_pooled``)."""
    return assess([point for point in points if point.samples_per_second], pool=pooled)[0]


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


def assess(points: Sequence[Point], pool: bool = True) -> tuple[dict[int, float], dict[int, float] | None]:
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

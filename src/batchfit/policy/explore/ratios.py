"""Speed ratios with a 90% interval, and whether the interval says the ratio is within noise, free
of torch: compare's paired readings (a t-interval on their logarithms) and explore's estimates (a
normal interval from their standard errors). docs/compare.md explains the choice."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

#: The intervals' two-sided level: explore's default confidence target, so a ratio and a
#: recommendation are held to the same odds.
LEVEL = 0.90
#: The normal quantile of a two-sided 90% interval.
Z = statistics.NormalDist().inv_cdf(0.5 + LEVEL / 2)
#: Student's t quantiles of a two-sided 90% interval, by degrees of freedom (readings - 1).
_T = {1: 6.314, 2: 2.920, 3: 2.353, 4: 2.132, 5: 2.015, 6: 1.943, 7: 1.895, 8: 1.860, 9: 1.833, 10: 1.812}


@dataclass(frozen=True)
class Ratio:
    """A speed ratio and its interval (None, None where the readings cannot give one)."""

    value: float
    low: float | None = None
    high: float | None = None


def t_quantile(degrees: int) -> float:
    """The two-sided 90% quantile of Student's t with ``degrees`` degrees of freedom: from the table
    up to 10, then the normal's with two Cornish-Fisher terms (within 0.1% of the exact value)."""
    if degrees < 1:
        raise ValueError(f"degrees must be 1 or more, got {degrees}.")
    if degrees in _T:
        return _T[degrees]
    return Z + (Z**3 + Z) / (4 * degrees) + (5 * Z**5 + 16 * Z**3 + 3 * Z) / (96 * degrees**2)


def paired(readings: Sequence[float], baseline: Sequence[float]) -> Ratio:
    """The ratio of ``readings`` to ``baseline``, read in pairs (reading i and baseline i taken
    moments apart, so a slow spell of the machine divides out).

    The value is the median of the pairs' ratios: one pair caught in a spell of its own cannot move
    it. The interval is Student's t on the mean of the ratios' logarithms: the logarithm makes a
    ratio's noise symmetric (2x and 0.5x are as far from 1), and t, unlike a bootstrap, widens for
    the spread that 3-5 readings can only estimate (a bootstrap of 3 readings draws from 10
    resamples and is narrower than the truth). One pair gives no interval.
    """
    ratios = [mine / base for mine, base in zip(readings, baseline, strict=True) if mine > 0 and base > 0]
    if not ratios:
        raise ValueError("paired needs at least one pair of positive readings.")
    value = statistics.median(ratios)
    if len(ratios) < 2:
        return Ratio(value)
    logs = [math.log(ratio) for ratio in ratios]
    half = t_quantile(len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    centre = statistics.fmean(logs)
    return Ratio(value, math.exp(centre - half), math.exp(centre + half))


def of_estimates(mine: float, base: float, mine_error: float, base_error: float) -> Ratio:
    """The ratio of two throughput estimates whose relative standard errors (of their logarithms)
    are ``mine_error`` and ``base_error``: a normal interval, as the bootstrap that gives explore's
    confidence redraws them (pooled over many windows and sizes, the errors are not t's few)."""
    value = mine / base
    half = Z * math.hypot(mine_error, base_error)
    return Ratio(value, value * math.exp(-half), value * math.exp(half))


def within_noise(low: float | None, high: float | None) -> bool:
    """Whether an interval includes 1: the readings cannot tell the ratio from no change. False
    where there is no interval (the noise is unknown, not shown to be small)."""
    return low is not None and high is not None and low <= 1 <= high


def ratio_text(value: float, low: float | None, high: float | None, of: str = "") -> str:
    """``1.29x [1.10, 1.52]``, ``1.02x [0.95, 1.09] (within noise)``, or ``1.29x`` without an
    interval; ``of`` follows the ratio (``" base"``: ``1.29x base [1.10, 1.52]``)."""
    if low is None or high is None:
        return f"{value:.2f}x{of}"
    noise = " (within noise)" if within_noise(low, high) else ""
    return f"{value:.2f}x{of} [{low:.2f}, {high:.2f}]{noise}"

"""The throughput chooser, free of torch: which measured batch to recommend, and how sure to be.

Each measured batch size has several timing windows (samples per second). The rule: the smallest
batch whose median throughput is within ``tolerance`` of the best median (as fast, more memory
headroom, better generalisation), or the fastest with ``objective="max-throughput"``. The
confidence is a bootstrap: windows are resampled per batch size, and it is the share of resamples
in which the recommended batch is still within the tolerance of that resample's best.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

from batchfit.errors import ConfigurationError

Objective = Literal["smallest-within-tolerance", "max-throughput"]


@dataclass(frozen=True)
class Point:
    """Throughput measured at one batch size: one value per timing window."""

    batch_size: int
    samples_per_second: tuple[float, ...]

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
    speedup: float  # median throughput of the recommendation over the base's
    confidence: int  # 0-100: bootstrap probability that the recommendation is within tolerance of the best

    def line(self) -> str:
        return (
            f"Current recommended micro_batch_size: {self.batch_size}, estimated performance: "
            f"{self.speedup:.2f}x base, confidence score: {self.confidence} (out of 100)"
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def pick(
    medians: dict[int, float], tolerance: float, objective: Objective, allowed: Callable[[int], bool]
) -> int | None:
    """The batch the rule picks from median throughputs (only ``allowed`` ones); None if none is."""
    candidates = {batch: value for batch, value in medians.items() if allowed(batch)}
    if not candidates:
        return None
    best = max(candidates.values())
    if objective == "max-throughput":
        return min(batch for batch, value in candidates.items() if value == best)
    return min(batch for batch, value in candidates.items() if value >= (1 - tolerance) * best)


def recommend(
    points: Sequence[Point],
    *,
    tolerance: float = 0.03,
    objective: Objective = "smallest-within-tolerance",
    base_batch_size: int | None = None,
    allowed: Callable[[int], bool] | None = None,
    resamples: int = 400,
    seed: int = 0,
) -> Recommendation | None:
    """The recommendation from what has been measured so far; None when nothing allowed is measured."""
    if not 0 <= tolerance < 1:
        raise ConfigurationError(f"tolerance={tolerance!r} must be in [0, 1), e.g. 0.03 for 3%.")
    if objective not in ("smallest-within-tolerance", "max-throughput"):
        raise ConfigurationError(
            f"objective={objective!r}: use 'smallest-within-tolerance' or 'max-throughput'."
        )
    allowed = allowed or (lambda batch: True)
    measured = [point for point in points if point.samples_per_second]
    medians = {point.batch_size: point.median for point in measured}
    chosen = pick(medians, tolerance, objective, allowed)
    if chosen is None:
        return None
    base = base_batch_size if base_batch_size in medians else min(medians)
    best = max((b for b in medians if allowed(b)), key=lambda b: medians[b])
    noise = _pooled_relative_noise(measured)
    rng = random.Random(seed)  # private: the user's random state is left alone
    hits = 0
    for _ in range(resamples if noise is not None else 0):
        # The standard error of a median is about 1.2533 x that of a mean of the same windows.
        sample = {
            point.batch_size: point.median
            * (1 + rng.gauss(0, 1) * 1.2533 * (noise or 0) / math.sqrt(len(point.samples_per_second)))
            for point in measured
        }
        top = max(value for batch, value in sample.items() if allowed(batch))
        hits += sample[chosen] >= (1 - tolerance) * top
    return Recommendation(
        batch_size=chosen,
        best_batch_size=best,
        base_batch_size=base,
        speedup=medians[chosen] / medians[base] if medians[base] > 0 else 0.0,
        confidence=round(100 * hits / resamples) if noise is not None else 0,
    )


def _pooled_relative_noise(points: Sequence[Point]) -> float | None:
    """The windows' relative standard deviation around their batch size's median, pooled; None
    when no batch size has two windows (no spread measured, no confidence)."""
    squares, degrees = 0.0, 0
    for point in points:
        if len(point.samples_per_second) < 2 or point.median <= 0:
            continue
        squares += sum(((value - point.median) / point.median) ** 2 for value in point.samples_per_second)
        degrees += len(point.samples_per_second) - 1
    return math.sqrt(squares / degrees) if degrees else None

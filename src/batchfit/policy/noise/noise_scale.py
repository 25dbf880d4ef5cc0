"""The gradient noise scale from squared gradient norms at two batch sizes, free of torch: the
"simple" estimator of McCandlish et al. (2018, arXiv 1812.06162, appendix A.1), its interval, and
what the number means for the batch size.

One reading is one optimizer step's pair of squared norms: the gradient of a small batch (a
micro-batch, or one rank's share before the all-reduce) and of the big batch that contains it (the
accumulated or all-reduced mean). Each reading gives unbiased estimates of the true gradient's
squared norm ``|G|^2`` and of the per-example covariance's trace ``tr(Sigma)``; the noise scale is
their ratio, taken after each is averaged over the readings (the ratio of one reading is too noisy
to average).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from batchfit.policy.explore.ratios import t_quantile


@dataclass(frozen=True)
class GradientReading:
    """One optimizer step's squared gradient norms at two batch sizes.

    ``small_norm_sq`` is the mean over the step's small batches of ``|g_small|^2`` (averaging the
    micro-batches of one step lowers its variance and keeps it unbiased), ``big_norm_sq`` is
    ``|g_big|^2`` of their mean. Both are of the loss's mean-reduced gradient, unscaled (a
    GradScaler's scale divided out).
    """

    small_batch_size: int
    big_batch_size: int
    small_norm_sq: float
    big_norm_sq: float

    def __post_init__(self) -> None:
        if not 0 < self.small_batch_size < self.big_batch_size:
            raise ValueError(
                f"a noise-scale reading needs 0 < small_batch_size < big_batch_size, got "
                f"{self.small_batch_size} and {self.big_batch_size}: measure a micro-batch against "
                "an accumulated batch of at least two micro-batches, or one rank against several"
            )
        for name in ("small_norm_sq", "big_norm_sq"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite squared norm >= 0, got {value}")

    def signal(self) -> float:
        """This reading's unbiased estimate of ``|G|^2``, the true gradient's squared norm."""
        small, big = self.small_batch_size, self.big_batch_size
        return (big * self.big_norm_sq - small * self.small_norm_sq) / (big - small)

    def noise(self) -> float:
        """This reading's unbiased estimate of ``tr(Sigma)``, the per-example gradient variance."""
        small, big = self.small_batch_size, self.big_batch_size
        return (self.small_norm_sq - self.big_norm_sq) / (1 / small - 1 / big)


@dataclass(frozen=True)
class NoiseScale:
    """The simple noise scale ``B_simple = tr(Sigma) / |G|^2`` over a run of readings.

    ``low`` and ``high`` bound it at 90% (a jackknife over the readings with Student's t; None with
    fewer than 3 readings). Where the averaged ``|G|^2`` is not positive the noise hides the signal
    at these batch sizes: ``b_simple`` is ``inf`` and the meaning says to measure longer or at
    larger batches.
    """

    b_simple: float
    low: float | None
    high: float | None
    steps: int
    small_batch_size: int
    big_batch_size: int
    gradient_norm_sq: float
    trace_sigma: float

    @property
    def resolved(self) -> bool:
        """Whether the signal stood above the noise (a finite, positive estimate)."""
        return math.isfinite(self.b_simple) and self.b_simple > 0

    def meaning(self) -> str:
        """One sentence on what the number says about the batch size."""
        if not self.resolved:
            return (
                f"the gradient's signal did not stand above its noise in {self.steps} steps at batch "
                f"sizes {self.small_batch_size} and {self.big_batch_size}: measure more steps, or "
                "at larger batches"
            )
        scale = round(self.b_simple)
        return (
            f"about {scale} samples is the critical batch: well below it a larger batch cuts the "
            "steps to a target almost in proportion; near it a run takes about twice the fewest "
            "steps and twice the fewest samples; well above it the steps barely shrink and the "
            "samples are spent"
        )

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["b_simple"] = self.b_simple if math.isfinite(self.b_simple) else None
        data["resolved"] = self.resolved
        data["meaning"] = self.meaning()
        return data


def estimate(readings: Sequence[GradientReading]) -> NoiseScale:
    """The noise scale over ``readings``, all at the same two batch sizes."""
    if not readings:
        raise ValueError("no gradient readings: the noise scale needs at least one optimizer step")
    sizes = {(reading.small_batch_size, reading.big_batch_size) for reading in readings}
    if len(sizes) > 1:
        raise ValueError(f"readings at different batch sizes cannot be averaged together: {sorted(sizes)}")
    signals = [reading.signal() for reading in readings]
    noises = [reading.noise() for reading in readings]
    signal, noise = statistics.fmean(signals), statistics.fmean(noises)
    low, high = _interval(signals, noises)
    small, big = sizes.pop()
    return NoiseScale(_ratio(noise, signal), low, high, len(readings), small, big, signal, noise)


def _ratio(noise: float, signal: float) -> float:
    return noise / signal if signal > 0 else math.inf


def _interval(signals: Sequence[float], noises: Sequence[float]) -> tuple[float | None, float | None]:
    """A 90% jackknife interval for the ratio of the two means (the delete-one ratios' spread,
    widened by Student's t for the few readings it rests on); None where it cannot be had."""
    count = len(signals)
    if count < 3:
        return None, None
    total_signal, total_noise = math.fsum(signals), math.fsum(noises)
    leave_one_out = [
        _ratio((total_noise - noise) / (count - 1), (total_signal - signal) / (count - 1))
        for signal, noise in zip(signals, noises, strict=True)
    ]
    whole = _ratio(total_noise / count, total_signal / count)
    if not all(math.isfinite(value) for value in [*leave_one_out, whole]):
        return None, None
    mean = statistics.fmean(leave_one_out)
    error = math.sqrt((count - 1) / count * math.fsum((value - mean) ** 2 for value in leave_one_out))
    half = t_quantile(count - 1) * error
    return max(whole - half, 0.0), whole + half

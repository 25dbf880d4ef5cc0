"""Goodput, free of torch: which measured batch trains fastest to a target, from explore's throughput
and the gradient noise scale ``B_noise`` (McCandlish et al. 2018, arXiv 1812.06162). A target takes
``S(B) = S_min (1 + B_noise / B)`` optimizer steps and ``E(B) = E_min (1 + B / B_noise)`` samples,
so its time, ``E(B) / throughput(B)``, is proportional to ``(B + B_noise) / throughput(B)``.

A batch's statistical efficiency is the work one of its samples does against the small-batch limit,
``E_min / E(B) = B_noise / (B + B_noise)``; goodput is throughput times it (Pollux, Qiao et al.,
OSDI 2021), so the batch of the highest goodput is the batch of the shortest time. docs/goodput.md.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import combinations, pairwise

from batchfit.checks import SAMPLE_TOLERANCE as SAMPLE_TOLERANCE
from batchfit.checks import check_noise_scale
from batchfit.errors import ConfigurationError
from batchfit.policy.explore.ratios import of_estimates
from batchfit.policy.noise.goodput_result import BatchGoodput, Goodput, Versus
from batchfit.policy.noise.noise_scale import NoiseScale


@dataclass(frozen=True)
class ThroughputAt:
    """Throughput at one measured batch size, and its relative standard error where known."""

    batch_size: int
    samples_per_second: float
    error: float | None = None  # of the logarithm, as explore's estimates carry it


def noise_scale_of(noise_scale: NoiseScale | float) -> tuple[float, float | None, float | None]:
    """``B_noise`` and its 90% interval (None, None without one) from a measured ``NoiseScale`` or a
    number given; a ConfigurationError for one that is not positive. The one place a number is read
    as a noise scale: ``Goal``, ``Checklist``, ``TrainingFacts`` and goodput take a ``NoiseScale``
    (what ``MicroBatchStep``, the monitor, the adapters and the ``noise_scale`` verb measure) or a
    number of samples as shorthand."""
    value = check_noise_scale(noise_scale)
    if isinstance(noise_scale, NoiseScale):
        return value, noise_scale.low, noise_scale.high
    return value, None, None


def goodput(
    throughputs: Sequence[ThroughputAt],
    noise_scale: NoiseScale | float,
    *,
    sample_tolerance: float = SAMPLE_TOLERANCE,
    world_size: int = 1,
    unit: str = "samples/s",
) -> Goodput:
    """Each measured batch predicted to a target at ``noise_scale`` (a measured ``NoiseScale`` or a
    number of samples), and the time-optimal and sample-optimal batches, each against the largest
    measured batch and the fastest. Only measured sizes are chosen: the throughput between them is
    not known (kernel tiling bends it by a few percent), and the time changes little near its
    optimum. ``world_size``: a step's batch is each measured batch size times it."""
    value, low, high = noise_scale_of(noise_scale)
    points = _checked(throughputs, sample_tolerance)
    best = _time_optimal(points, value, world_size)
    rows = tuple(_row(point, best, value, world_size) for point in points)
    within = [p for p in points if p.batch_size * world_size <= sample_tolerance * value]
    sample_best = _time_optimal(within, value, world_size) if within else None
    fastest = max(points, key=lambda point: point.samples_per_second)  # the first: the smallest
    largest = points[-1]
    versus = [
        _versus(name, chosen, reference_name, reference, value, world_size)
        for name, chosen in (("time-optimal", best), ("sample-optimal", sample_best))
        if chosen is not None
        for reference_name, reference in (("largest", largest), ("fastest", fastest))
    ]
    optima = None if low is None or high is None else _optima(points, low, high, world_size)
    return Goodput(
        value,
        low,
        high,
        isinstance(noise_scale, NoiseScale),
        world_size,
        sample_tolerance,
        unit,
        rows,
        best.batch_size,
        optima,
        None if sample_best is None else sample_best.batch_size,
        fastest.batch_size,
        largest.batch_size,
        tuple(versus),
    )


def _checked(throughputs: Sequence[ThroughputAt], sample_tolerance: float) -> list[ThroughputAt]:
    if not throughputs:
        raise ConfigurationError("goodput needs the throughput at one measured batch size at least.")
    sizes = [point.batch_size for point in throughputs]
    if len(set(sizes)) < len(sizes):
        raise ConfigurationError(f"goodput needs one throughput per batch size, got sizes {sorted(sizes)}.")
    for point in throughputs:
        if not (point.batch_size > 0 and 0 < point.samples_per_second < math.inf):
            raise ConfigurationError(
                f"batch size {point.batch_size}: goodput needs a positive batch size and a positive, "
                f"finite throughput, got {point.samples_per_second}; leave out sizes nothing got through."
            )
    if not 0 <= sample_tolerance < math.inf:
        raise ConfigurationError(f"sample_tolerance must be a share >= 0 (0.1: 10%), got {sample_tolerance}.")
    return sorted(throughputs, key=lambda point: point.batch_size)


def _spread(batch: float, reference: float, noise_scale: float) -> float:
    """``(batch + B_noise) / (reference + B_noise)``: the samples' ratio, 1 when B_noise is inf."""
    return (batch / noise_scale + 1) / (reference / noise_scale + 1)


def _time(point: ThroughputAt, noise_scale: float, world_size: int) -> float:
    """The time to the target, up to a factor shared by every batch size."""
    if math.isinf(noise_scale):
        return 1 / point.samples_per_second
    return (point.batch_size * world_size + noise_scale) / point.samples_per_second


def _time_optimal(points: Sequence[ThroughputAt], noise_scale: float, world_size: int) -> ThroughputAt:
    """The point of the shortest time; of equal times, the smallest batch (less memory)."""
    return min(points, key=lambda point: _time(point, noise_scale, world_size))


def _row(point: ThroughputAt, best: ThroughputAt, noise_scale: float, world_size: int) -> BatchGoodput:
    batch, reference = point.batch_size * world_size, best.batch_size * world_size
    samples = _spread(batch, reference, noise_scale)
    efficiency = 1 / (1 + batch / noise_scale)
    return BatchGoodput(
        point.batch_size,
        point.samples_per_second,
        efficiency,
        point.samples_per_second * efficiency,
        samples * best.samples_per_second / point.samples_per_second,
        samples,
        samples * reference / batch,
    )


def _versus(
    name: str, chosen: ThroughputAt, reference_name: str, reference: ThroughputAt, noise: float, world: int
) -> Versus:
    samples = _spread(chosen.batch_size * world, reference.batch_size * world, noise)
    speed = reference.samples_per_second / chosen.samples_per_second
    low = high = None
    if chosen != reference and chosen.error is not None and reference.error is not None:
        ratio = of_estimates(
            reference.samples_per_second, chosen.samples_per_second, reference.error, chosen.error
        )
        low, high = samples * (ratio.low or 0.0), samples * (ratio.high or 0.0)
    steps = samples * reference.batch_size / chosen.batch_size
    return Versus(
        name,
        chosen.batch_size,
        reference_name,
        reference.batch_size,
        samples * speed,
        samples,
        steps,
        low,
        high,
    )


def _optima(points: Sequence[ThroughputAt], low: float, high: float, world_size: int) -> tuple[int, ...]:
    """Every point time-optimal for some noise scale in [low, high]. Each point's time is a line in
    the noise scale, so the optimum changes only where two lines cross: it is probed at both ends,
    at each crossing inside, and between consecutive ones."""
    cuts = {low, high}
    for one, other in combinations(points, 2):
        slope = 1 / one.samples_per_second - 1 / other.samples_per_second
        if slope:
            at = (_time(other, 0.0, world_size) - _time(one, 0.0, world_size)) / slope
            if low < at < high:
                cuts.add(at)
    ordered = sorted(cuts)
    probes = [*ordered, *((a + b) / 2 for a, b in pairwise(ordered))]
    return tuple(sorted({_time_optimal(points, probe, world_size).batch_size for probe in probes}))

"""Goodput's arithmetic against brute force: on synthetic throughput curves the steps, samples and time
to a target are simulated from McCandlish et al.'s S(B) and E(B) directly, and every ratio, choice and
range must match; the edge cases (unresolved, one size, none) say what they mean."""

from __future__ import annotations

import json
import math
import random

import pytest

from batchfit.errors import ConfigurationError
from batchfit.policy.noise.goodput import ThroughputAt, goodput
from batchfit.policy.noise.noise_scale import NoiseScale

S_MIN = 1000.0  # the fewest steps to the target: any value, every ratio divides it out
SIZES = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 256, 512)


def curve(rng: random.Random) -> list[ThroughputAt]:
    """A throughput that rises, saturates and may fall a little, with bumps of a few percent."""
    peak, knee, fall = rng.uniform(500, 5000), rng.uniform(4, 200), rng.uniform(0, 0.3)
    return [
        ThroughputAt(size, peak * size / (size + knee) * (1 - fall * size / 512) * rng.uniform(0.97, 1.03))
        for size in SIZES
    ]


def steps(batch: float, noise: float) -> float:
    return S_MIN * (1 + noise / batch)


def seconds(point: ThroughputAt, noise: float) -> float:
    """Steps x samples per step / samples per second: the time to the target, simulated."""
    return steps(point.batch_size, noise) * point.batch_size / point.samples_per_second


def brute_optimum(points: list[ThroughputAt], noise: float) -> int:
    return min(points, key=lambda point: (seconds(point, noise), point.batch_size)).batch_size


@pytest.mark.parametrize("seed", range(40))
def test_every_row_and_choice_matches_the_simulated_run(seed: int) -> None:
    rng = random.Random(seed)
    points, noise = curve(rng), math.exp(rng.uniform(math.log(2), math.log(2000)))
    tolerance = rng.choice([0.05, 0.1, 0.5])
    result = goodput(points, noise, sample_tolerance=tolerance)
    best = brute_optimum(points, noise)
    assert result.time_optimal == best
    by_size = {point.batch_size: point for point in points}
    fewest_samples = S_MIN * noise  # E_min: the small-batch limit of steps x batch
    for row in result.rows:
        point, chosen = by_size[row.batch_size], by_size[best]
        samples = steps(row.batch_size, noise) * row.batch_size
        assert row.efficiency == pytest.approx(fewest_samples / samples)
        assert row.goodput == pytest.approx(point.samples_per_second * fewest_samples / samples)
        assert row.time_ratio == pytest.approx(seconds(point, noise) / seconds(chosen, noise))
        assert row.samples_ratio == pytest.approx(samples / (steps(best, noise) * best))
        assert row.steps_ratio == pytest.approx(steps(row.batch_size, noise) / steps(best, noise))
    assert max(result.rows, key=lambda row: row.goodput).batch_size == best  # the highest goodput
    within = [
        p for p in points if steps(p.batch_size, noise) * p.batch_size <= (1 + tolerance) * fewest_samples
    ]
    assert result.sample_optimal == (brute_optimum(within, noise) if within else None)
    fastest = max(points, key=lambda point: point.samples_per_second)
    assert (result.fastest, result.largest) == (fastest.batch_size, 512)


@pytest.mark.parametrize("seed", range(40))
def test_the_optimal_range_is_every_batch_optimal_somewhere_in_the_interval(seed: int) -> None:
    rng = random.Random(seed)
    points, noise = curve(rng), math.exp(rng.uniform(math.log(4), math.log(1000)))
    low, high = noise / rng.uniform(1.05, 4), noise * rng.uniform(1.05, 4)
    result = goodput(points, NoiseScale(noise, low, high, 8, 8, 64, 1.0, noise))
    grid = [low * (high / low) ** (i / 20000) for i in range(20001)]
    assert result.time_optimal_range == tuple(sorted({brute_optimum(points, n) for n in grid}))
    assert result.settled == (len(result.time_optimal_range) == 1)
    assert result.time_optimal in result.time_optimal_range


def test_each_choice_is_compared_with_the_largest_and_the_fastest_with_the_throughputs_interval() -> None:
    points = [ThroughputAt(8, 400.0, 0.02), ThroughputAt(32, 1000.0, 0.02), ThroughputAt(128, 1100.0, 0.03)]
    result = goodput(points, 40.0, sample_tolerance=0.2)
    assert (result.time_optimal, result.sample_optimal, result.fastest, result.largest) == (32, 8, 128, 128)
    versus = {(v.chosen, v.reference): v for v in result.versus}
    assert set(versus) == {
        (chosen, reference)
        for chosen in ("time-optimal", "sample-optimal")
        for reference in ("largest", "fastest")
    }
    chosen, largest = versus["time-optimal", "largest"], points[2]
    assert chosen.time_ratio == pytest.approx(seconds(points[1], 40.0) / seconds(largest, 40.0))
    assert chosen.samples_ratio == pytest.approx((32 + 40) / (128 + 40))
    assert chosen.steps_ratio == pytest.approx(steps(32, 40.0) / steps(128, 40.0))
    assert chosen.time_ratio_low is not None and chosen.time_ratio_high is not None
    assert chosen.time_ratio_low < chosen.time_ratio < chosen.time_ratio_high
    assert result.lines()[:2] == [
        "time-optimal batch_size 32 (the highest goodput):",
        f"  {chosen.line('the largest measured and the fastest')}",
    ]
    assert result.lines()[-1] == (
        "the noise scale 40 has no interval: the choice is as sure as that number (a measured noise "
        "scale of 3 or more steps gives one)"
    )


def test_an_unresolved_noise_scale_costs_no_samples_and_the_fastest_is_time_optimal() -> None:
    points = [ThroughputAt(16, 900.0), ThroughputAt(64, 1300.0), ThroughputAt(256, 1250.0)]
    unresolved = NoiseScale(math.inf, None, None, 10, 8, 64, -0.5, 30.0)
    result = goodput(points, unresolved)
    assert not result.resolved and result.measured
    assert (result.time_optimal, result.sample_optimal, result.fastest) == (64, 64, 64)
    assert [row.efficiency for row in result.rows] == [1.0, 1.0, 1.0]
    assert [row.samples_ratio for row in result.rows] == [1.0, 1.0, 1.0]
    assert [row.steps_ratio for row in result.rows] == [4.0, 1.0, 0.25]  # in proportion to the batch
    assert "larger batches are taken to cost no extra samples" in result.lines()[-1]
    document = json.loads(json.dumps(result.to_dict(), allow_nan=False))
    assert document["noise_scale"] is None and document["resolved"] is False


def test_one_measured_size_is_every_choice() -> None:
    result = goodput([ThroughputAt(32, 500.0)], NoiseScale(100.0, 80.0, 130.0, 5, 8, 64, 1.0, 100.0))
    assert (result.time_optimal, result.time_optimal_range, result.fastest, result.largest) == (
        32,
        (32,),
        32,
        32,
    )
    assert result.sample_optimal is None  # 32 samples use 1.32x the fewest, outside 10%
    assert result.lines()[0] == (
        "time-optimal batch_size 32 (the highest goodput; it is also the largest measured and the fastest):"
    )
    assert result.settled and result.lines()[-1].startswith("settled: time-optimal across")


def test_a_step_over_several_devices_is_the_batch_times_the_world_size() -> None:
    points = [ThroughputAt(size, 100.0 * size / (1 + size / 16)) for size in (2, 4, 8, 16, 32, 64)]
    spread = goodput(points, 200.0, world_size=8)
    alone = goodput([ThroughputAt(8 * p.batch_size, p.samples_per_second) for p in points], 200.0)
    assert spread.time_optimal * 8 == alone.time_optimal
    assert [row.time_ratio for row in spread.rows] == pytest.approx([row.time_ratio for row in alone.rows])


@pytest.mark.parametrize(
    ("points", "noise", "message"),
    [
        ([], 10.0, "goodput needs the throughput at one measured batch size at least."),
        (
            [ThroughputAt(8, 1.0), ThroughputAt(8, 2.0)],
            10.0,
            "goodput needs one throughput per batch size, got sizes [8, 8].",
        ),
        (
            [ThroughputAt(8, 0.0)],
            10.0,
            (
                "batch size 8: goodput needs a positive batch size and a positive, finite throughput, got "
                "0.0; leave out sizes nothing got through."
            ),
        ),
        (
            [ThroughputAt(8, 1.0)],
            -3.0,
            (
                "noise_scale must be a positive number of samples (inf: the noise hid the signal), got "
                "-3.0; a measured noise scale of 0 or less says the noise did not show at the batches "
                "measured: measure it at smaller batches."
            ),
        ),
        (
            [ThroughputAt(8, 1.0)],
            "250",
            "noise_scale must be a number of samples or a measured NoiseScale, got '250'.",
        ),
    ],
)
def test_errors_say_what_was_wrong(points: list[ThroughputAt], noise: object, message: str) -> None:
    with pytest.raises(ConfigurationError) as error:
        goodput(points, noise)  # type: ignore[arg-type]
    assert str(error.value) == message

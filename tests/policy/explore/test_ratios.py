"""Speed ratios and their 90% intervals: the arithmetic on known readings, and the coverage that
makes a t-interval the right one for 3-5 paired readings."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from batchfit.policy.explore.ratios import Ratio, of_estimates, paired, ratio_text, t_quantile, within_noise


def test_a_paired_ratio_is_the_median_with_a_t_interval_on_the_logarithms() -> None:
    # Ratios 1.2, 1.3 and 1.25: the median 1.25, the interval the mean log ratio +- t(2) x s / sqrt(3).
    ratio = paired([120.0, 130.0, 125.0], [100.0, 100.0, 100.0])
    logs = [math.log(1.2), math.log(1.3), math.log(1.25)]
    half = 2.920 * statistics.stdev(logs) / math.sqrt(3)
    assert ratio.value == 1.25
    assert ratio.low == pytest.approx(math.exp(statistics.fmean(logs) - half))
    assert ratio.high == pytest.approx(math.exp(statistics.fmean(logs) + half))
    assert (round(ratio.low, 3), round(ratio.high, 3)) == (1.168, 1.337)
    assert not within_noise(ratio.low, ratio.high)


def test_one_slow_spell_widens_the_interval_to_noise_without_moving_the_median() -> None:
    # Round 3 caught the row alone in a slow spell: the median still says 1.5, and the interval
    # says the three readings cannot tell it from no change.
    ratio = paired([150.0, 90.0, 60.0], [100.0, 60.0, 100.0])
    assert ratio.value == 1.5
    assert ratio.low is not None and ratio.high is not None
    assert ratio.low < 1 < ratio.high and within_noise(ratio.low, ratio.high)


def test_one_pair_gives_no_interval_and_is_not_called_noise() -> None:
    assert paired([130.0], [100.0]) == Ratio(1.3)
    assert not within_noise(None, None)


def test_the_interval_covers_the_true_ratio_nine_times_in_ten_with_three_readings() -> None:
    """The reason for t: 3 paired readings with 10% noise, 4000 times. The t-interval covers the
    true ratio (1.2) about 90% of the time; a normal interval on the same readings, which takes
    their spread as known, about 76%; a percentile bootstrap (200 resamples of the 3 log ratios),
    about 64%."""
    rng = random.Random(0)
    covered = normal = bootstrap = 0
    trials = 4000
    for _ in range(trials):
        base = [100.0 * math.exp(rng.gauss(0, 0.1)) for _ in range(3)]
        mine = [120.0 * math.exp(rng.gauss(0, 0.1)) for _ in range(3)]
        ratio = paired(mine, base)
        assert ratio.low is not None and ratio.high is not None
        covered += ratio.low <= 1.2 <= ratio.high
        logs = [math.log(a / b) for a, b in zip(mine, base, strict=True)]
        half = 1.645 * statistics.stdev(logs) / math.sqrt(3)
        normal += abs(statistics.fmean(logs) - math.log(1.2)) <= half
        means = sorted(statistics.fmean(rng.choices(logs, k=3)) for _ in range(200))
        bootstrap += means[10] <= math.log(1.2) <= means[189]
    assert 0.88 < covered / trials < 0.92
    assert 0.72 < normal / trials < 0.8
    assert 0.6 < bootstrap / trials < 0.7


@pytest.mark.parametrize(
    ("degrees", "exact"),
    [(1, 6.314), (2, 2.920), (4, 2.132), (10, 1.812), (11, 1.796), (20, 1.725), (30, 1.697), (120, 1.658)],
)
def test_t_quantiles_match_the_table_of_student_s_t(degrees: int, exact: float) -> None:
    assert t_quantile(degrees) == pytest.approx(exact, rel=1e-3)


def test_a_ratio_of_estimates_has_a_normal_interval_from_their_errors() -> None:
    ratio = of_estimates(150.0, 100.0, 0.03, 0.04)  # relative errors: 3% and 4%, 5% together
    assert ratio.value == 1.5
    assert ratio.low == pytest.approx(1.5 * math.exp(-1.6449 * 0.05), rel=1e-4)
    assert ratio.high == pytest.approx(1.5 * math.exp(1.6449 * 0.05), rel=1e-4)


@pytest.mark.parametrize(
    ("ratio", "text"),
    [
        (Ratio(1.29, 1.1, 1.52), "1.29x [1.10, 1.52]"),
        (Ratio(1.02, 0.95, 1.09), "1.02x [0.95, 1.09] (within noise)"),
        (Ratio(0.8, 0.7, 0.9), "0.80x [0.70, 0.90]"),
        (Ratio(1.29), "1.29x"),
    ],
)
def test_ratio_text(ratio: Ratio, text: str) -> None:
    assert ratio_text(ratio.value, ratio.low, ratio.high) == text

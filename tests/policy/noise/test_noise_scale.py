"""The simple noise-scale estimator's arithmetic: on readings made from a known |G|^2 and
tr(Sigma), it returns them; its errors name what was wrong."""

from __future__ import annotations

import math
import random

import pytest

from batchfit.policy.noise.noise_scale import GradientReading, estimate


def expected_reading(signal: float, noise: float, small: int, big: int) -> GradientReading:
    """The readings' expectations: E|g_B|^2 = |G|^2 + tr(Sigma) / B."""
    return GradientReading(small, big, signal + noise / small, signal + noise / big)


def test_expected_readings_give_back_the_signal_the_noise_and_their_ratio() -> None:
    result = estimate([expected_reading(2.0, 300.0, 8, 64)] * 4)
    assert result.gradient_norm_sq == pytest.approx(2.0)
    assert result.trace_sigma == pytest.approx(300.0)
    assert result.b_simple == pytest.approx(150.0)
    assert result.low == pytest.approx(150.0) and result.high == pytest.approx(150.0)
    assert result.resolved and "150 samples" in result.meaning()


def test_noisy_readings_average_before_the_ratio_and_the_interval_covers_the_truth() -> None:
    rng = random.Random(0)
    covered = 0
    for _ in range(200):
        readings = []
        for _ in range(30):
            exact = expected_reading(1.0, 100.0, 16, 128)
            readings.append(
                GradientReading(
                    16,
                    128,
                    exact.small_norm_sq * rng.uniform(0.7, 1.3),
                    exact.big_norm_sq * rng.uniform(0.85, 1.15),
                )
            )
        result = estimate(readings)
        assert result.low is not None and result.high is not None
        covered += result.low <= 100.0 <= result.high
    assert covered / 200 > 0.8


def test_a_signal_hidden_by_the_noise_is_not_resolved() -> None:
    result = estimate([GradientReading(8, 16, 1.0, 0.4), GradientReading(8, 16, 1.0, 0.45)])
    assert not result.resolved and math.isinf(result.b_simple)
    assert result.to_dict()["b_simple"] is None and "measure more steps" in result.meaning()


@pytest.mark.parametrize(
    ("small", "big", "message"),
    [(8, 8, "small_batch_size < big_batch_size"), (0, 8, "0 < small_batch_size"), (16, 8, "got 16 and 8")],
)
def test_equal_or_inverted_sizes_are_refused_with_what_to_measure(small: int, big: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        GradientReading(small, big, 1.0, 1.0)


def test_a_non_finite_norm_and_mixed_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match="small_norm_sq must be a finite"):
        GradientReading(8, 16, math.nan, 1.0)
    with pytest.raises(ValueError, match="different batch sizes"):
        estimate([expected_reading(1.0, 1.0, 8, 16), expected_reading(1.0, 1.0, 8, 32)])
    with pytest.raises(ValueError, match="at least one optimizer step"):
        estimate([])

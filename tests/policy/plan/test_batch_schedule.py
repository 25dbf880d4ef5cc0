"""The batch schedule and the noise-scale monitor, free of torch: when the batch grows (against brute
force over the caps and a hand-computed margin), by how much the learning rate is scaled, and what
the monitor reports every N steps (against the offline estimate of the same readings)."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from batchfit.errors import ConfigurationError
from batchfit.policy.noise.noise_scale import GradientReading, NoiseScale, estimate
from batchfit.policy.plan.batch_schedule import BatchSchedule
from batchfit.policy.plan.noise_monitor import NoiseScaleAverage, NoiseScaleMonitor


def noise_scale(low: float | None, steps: int = 20) -> NoiseScale:
    high = None if low is None else low * 2
    return NoiseScale(1.5 * (low or 1), low, high, steps, 8, 32, 1.0, 1.5 * (low or 1))


def reading(signal: float, noise: float, small: int = 8, big: int = 32) -> GradientReading:
    """The expectations of a reading: E|g_B|^2 = |G|^2 + tr(Sigma) / B."""
    return GradientReading(small, big, signal + noise / small, signal + noise / big)


@pytest.mark.parametrize(
    ("max_global", "max_accumulation", "micro", "world"),
    list(itertools.product([None, 24, 100, 1000], [1, 4, 16], [1, 3, 8], [1, 2])),
)
def test_growth_is_the_largest_accumulation_up_to_double_within_both_caps(
    max_global: int | None, max_accumulation: int, micro: int, world: int
) -> None:
    schedule = BatchSchedule(max_global_batch_size=max_global, max_accumulation_steps=max_accumulation)
    for accumulation in range(1, 20):
        allowed = [
            grown
            for grown in range(accumulation + 1, 2 * accumulation + 1)
            if grown <= max_accumulation and (max_global is None or micro * grown * world <= max_global)
        ]
        truth = max(allowed) if allowed else None
        assert schedule.grown_accumulation(accumulation, micro, world) == truth


@pytest.mark.parametrize(
    ("optimizer", "rule", "factor"),
    [("SGD", None, 2.0), ("AdamW", None, math.sqrt(2)), ("AdamW", "linear", 2.0), (None, None, 2.0)],
)
def test_a_lower_bound_at_the_grown_batch_doubles_it_and_scales_the_rate_by_the_rule(
    optimizer: str | None, rule: str | None, factor: float
) -> None:
    schedule = BatchSchedule(max_global_batch_size=1024, margin=1.5, scaling_rule=rule)  # type: ignore[arg-type]
    # micro 16 x accumulation 2 x 2 ranks = 64 grows to 128: it needs low >= 1.5 x 128 = 192.
    keywords = {"optimizer_step": 40, "accumulation_steps": 2, "micro_batch_size": 16, "world_size": 2}
    assert schedule.decide(noise_scale(191.9), optimizer=optimizer, **keywords) is None  # type: ignore[arg-type]
    change = schedule.decide(noise_scale(192.0), optimizer=optimizer, **keywords)  # type: ignore[arg-type]
    assert change is not None
    assert (change.old_accumulation_steps, change.new_accumulation_steps) == (2, 4)
    assert (change.old_global_batch_size, change.new_global_batch_size) == (64, 128)
    assert change.learning_rate_factor == pytest.approx(factor)
    assert change.optimizer_step == 40 and change.evidence.low == 192.0
    assert change.summary().startswith(
        "global_batch_size 64 -> 128 (accumulation_steps 2 -> 4) at optimizer step 40, learning rate x "
    )
    assert "90% interval 192-384 over 20 steps at batch sizes 8 and 32" in change.summary()


def test_no_change_on_too_few_steps_no_interval_or_at_the_caps() -> None:
    schedule = BatchSchedule(max_global_batch_size=64, min_steps=10)
    keywords = {"optimizer_step": 0, "micro_batch_size": 16, "world_size": 1}
    assert schedule.decide(noise_scale(1e9, steps=9), accumulation_steps=1, **keywords) is None  # type: ignore[arg-type]
    assert schedule.decide(noise_scale(None), accumulation_steps=1, **keywords) is None  # type: ignore[arg-type]
    assert schedule.decide(noise_scale(1e9), accumulation_steps=4, **keywords) is None  # type: ignore[arg-type]
    grown = schedule.decide(noise_scale(1e9, steps=10), accumulation_steps=1, **keywords)  # type: ignore[arg-type]
    assert grown is not None and grown.new_accumulation_steps == 2


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"min_steps": 2}, "min_steps must be an integer >= 3, got 2."),
        ({"margin": 0}, "margin must be a positive number, got 0."),
        ({"scaling_rule": "cube"}, "scaling_rule must be 'linear' or 'sqrt', got 'cube'."),
        ({"max_global_batch_size": 0}, "max_global_batch_size must be a positive integer, got 0."),
    ],
)
def test_schedule_errors_name_the_option(options: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigurationError) as raised:
        BatchSchedule(**options)  # type: ignore[arg-type]
    assert str(raised.value) == message


def test_the_monitor_reports_every_n_steps_the_offline_estimate_of_its_window() -> None:
    rng = random.Random(0)
    readings = [
        GradientReading(8, 32, 3.0 * rng.uniform(0.5, 1.5), 1.5 * rng.uniform(0.8, 1.2)) for _ in range(12)
    ]
    monitor = NoiseScaleMonitor(every=4, window=6)
    reports = [
        monitor.record(item, optimizer_step=step, accumulation_steps=4, micro_batch_size=8)
        for step, item in enumerate(readings)
    ]
    assert [step for step, report in enumerate(reports) if report is not None] == [3, 7, 11]
    for step in (3, 7, 11):
        report = reports[step]
        assert report is not None and report.change is None
        assert report.noise_scale == estimate(readings[max(0, step - 5) : step + 1])
    assert monitor.latest is reports[11]


def test_the_running_average_is_the_bias_corrected_ratio_by_hand() -> None:
    average = NoiseScaleAverage(0.5)
    assert average.b_simple == math.inf
    first, second = reading(2.0, 100.0), reading(4.0, 100.0)
    average.add(first)
    assert average.b_simple == pytest.approx(50.0)
    average.add(second)
    signal = 0.5 * 0.5 * first.signal() + 0.5 * second.signal()
    noise = 0.5 * 0.5 * first.noise() + 0.5 * second.noise()
    assert average.b_simple == pytest.approx(noise / signal)


def test_a_new_batch_size_starts_a_new_window_and_a_change_clears_it() -> None:
    schedule = BatchSchedule(min_steps=3, max_accumulation_steps=8)
    monitor = NoiseScaleMonitor(every=3, schedule=schedule)
    keywords = {"micro_batch_size": 8, "world_size": 1}
    for step in range(2):
        assert (
            monitor.record(reading(1.0, 50.0, 8, 16), optimizer_step=step, accumulation_steps=2, **keywords)
            is None
        )
    # B_simple 1000 >= the grown batch 32: the third reading at 8/32 completes a window of one alone.
    report = monitor.record(reading(1.0, 1000.0, 8, 32), optimizer_step=2, accumulation_steps=4, **keywords)
    assert report is not None and report.noise_scale.steps == 1 and report.change is None  # 1 < min_steps
    for step in (3, 4):
        monitor.record(reading(1.0, 1000.0, 8, 32), optimizer_step=step, accumulation_steps=4, **keywords)
    report = monitor.record(reading(1.0, 1000.0, 8, 32), optimizer_step=5, accumulation_steps=4, **keywords)
    assert report is not None and report.change is not None
    assert report.change.new_accumulation_steps == 8 and report.change.optimizer_step == 6
    assert len(monitor.readings) == 0 and monitor.changes == [report.change]
    assert "; global_batch_size 32 -> 64 (accumulation_steps 4 -> 8) at optimizer step 6" in report.line()


def test_a_window_below_min_steps_is_refused() -> None:
    with pytest.raises(ConfigurationError) as raised:
        NoiseScaleMonitor(every=5, window=5, schedule=BatchSchedule(min_steps=10))
    assert str(raised.value) == (
        "window (5) is below the schedule's min_steps (10): the schedule could never decide; raise "
        "window or lower min_steps."
    )

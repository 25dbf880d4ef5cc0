"""The data check's time in plain Python: what a setting is expected to cost, which settings a
spent budget leaves out (against what ``try_settings`` measures with no budget, the truth), and a
check on a simulated clock that starts no setting the time left does not fit."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest
from test_loader_settings import Loader

from batchfit.policy.explore.loader_budget import (
    OUT_OF_TIME,
    expected_seconds,
    not_measured,
    settings_left,
)
from batchfit.policy.explore.loader_settings import LoaderSetting, SettingRow, try_settings
from batchfit.policy.explore.time_budget import TimeBudget

ZERO = LoaderSetting()
EVERY = ("num_workers", "prefetch_factor", "pin_memory", "persistent_workers")


def test_a_setting_costs_its_start_a_warm_up_round_and_a_window_at_the_slowest_rate() -> None:
    rows = [SettingRow(ZERO, 100.0, 0.5, 0.2), SettingRow(LoaderSetting(1), 400.0, 0.1, 0.9)]
    # 32 samples at the slowest rate (100/s): 0.32 s a batch. Four workers: the longest start
    # measured (0.9 s), four warm-up batches (1.28 s), then 5 batches (1.6 s) outlast a 1 s window.
    cost = expected_seconds(LoaderSetting(4), rows, batch_size=32, window_seconds=1.0, min_batches=5)
    assert cost == pytest.approx(0.9 + 4 * 0.32 + 5 * 0.32)
    # A long window outlasts the batches; no workers still warm up on one batch.
    cost = expected_seconds(ZERO, rows, batch_size=32, window_seconds=3.0, min_batches=5)
    assert cost == pytest.approx(0.9 + 0.32 + 3.0)
    with pytest.raises(ValueError, match="at least one measured row"):
        expected_seconds(ZERO, [], batch_size=32, window_seconds=1.0, min_batches=5)


@pytest.mark.parametrize("cuda", [False, True])
@pytest.mark.parametrize("cores", [2, 4, 8])
def test_the_settings_left_are_those_the_unbounded_trying_goes_on_to_measure(cuda: bool, cores: int) -> None:
    # Loading scales with the workers and the step is far faster: the climb goes to the top and
    # every setting of the plan is measured, the truth each cut is compared with.
    loader = Loader(per_worker=100, step=10_000, cores=cores)
    current = loader.measure(ZERO)
    truth, stop = try_settings(
        current, loader.measure, max_num_workers=cores, knobs=EVERY, cuda=cuda, tolerance=0.03
    )
    assert stop == "exhausted"
    for cut in range(1, len(truth) + 1):
        rows, stop = try_settings(
            current,
            loader.measure,
            max_num_workers=cores,
            knobs=EVERY,
            cuda=cuda,
            tolerance=0.03,
            fits=lambda setting, rows, cut=cut: len(rows) < cut,
        )
        assert rows == truth[:cut] and (stop == "time_budget") == (cut < len(truth))
        left = settings_left(ZERO, rows, max_num_workers=cores, knobs=EVERY, cuda=cuda)
        assert left == tuple(row.setting for row in truth[cut:]), cut


def test_only_the_knobs_the_loader_takes_are_left() -> None:
    rows = [SettingRow(ZERO, 100.0, 0.5, 0.0)]
    assert settings_left(ZERO, rows, max_num_workers=2, knobs=("num_workers",), cuda=True) == (
        LoaderSetting(1),
        LoaderSetting(2),
    )
    assert settings_left(ZERO, rows, max_num_workers=2, knobs=(), cuda=True) == ()


class Clock:
    """Seconds that pass only when a measurement says so."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("seconds", [0.0, 2.0, 5.0, 9.0, 100.0])
def test_on_a_budget_no_setting_is_started_that_the_time_left_does_not_fit(seconds: float) -> None:
    loader, clock = Loader(per_worker=100, step=10_000, cores=8), Clock()
    budget = TimeBudget(seconds, clock)
    costs: dict[LoaderSetting, float] = {}
    measured: list[SettingRow] = []

    def measure(setting: LoaderSetting) -> SettingRow:
        costs[setting] = expected_seconds(setting, measured, batch_size=32, window_seconds=1.0, min_batches=5)
        clock.now += costs[setting]  # each measurement takes what was expected of it
        measured.append(loader.measure(setting))
        return measured[-1]

    def fits(setting: LoaderSetting, rows: Sequence[SettingRow]) -> bool:
        return budget.allows(
            expected_seconds(setting, rows, batch_size=32, window_seconds=1.0, min_batches=5)
        )

    current = loader.measure(ZERO)
    measured.append(current)
    rows, stop = try_settings(
        current, measure, max_num_workers=8, knobs=EVERY, cuda=False, tolerance=0.03, fits=fits
    )
    assert budget.spent() <= seconds  # every cost was known here, so none overran
    left = settings_left(ZERO, rows, max_num_workers=8, knobs=EVERY, cuda=False)
    named = not_measured(left, rows, batch_size=32, window_seconds=1.0, min_batches=5)
    assert (stop == "time_budget") == bool(named)
    assert [entry.part for entry in named] == [setting.describe() for setting in left]
    assert all(entry.reason == OUT_OF_TIME and entry.needs_seconds for entry in named)
    if named:  # the first one left is the one that did not fit
        assert not budget.allows(named[0].needs_seconds or math.inf)
    assert (seconds == 100.0) == (stop != "time_budget")  # a long budget measures them all

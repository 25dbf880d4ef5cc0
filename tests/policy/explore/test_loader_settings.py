"""The data-loading check's decisions in plain Python: the worker ladder, which settings are tried
against a synthetic loader, and the recommendation (cheapest within tolerance, gain, persistence)."""

from __future__ import annotations

import pytest

from batchfit.errors import ConfigurationError
from batchfit.policy.explore.loader_settings import (
    WAIT_SHARE_THRESHOLD,
    LoaderSearch,
    LoaderSetting,
    SettingRow,
    is_bottleneck,
    recommend,
    startup_share,
    try_settings,
    worker_ladder,
)

ZERO = LoaderSetting()


def row(
    num_workers: int = 0,
    samples_per_second: float = 100.0,
    wait: float = 0.5,
    startup: float = 0.0,
    **knobs: object,
) -> SettingRow:
    return SettingRow(LoaderSetting(num_workers, **knobs), samples_per_second, wait, startup)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("cores", "ladder"),
    [(0, (0,)), (1, (0, 1)), (2, (0, 1, 2)), (6, (0, 1, 2, 4, 6)), (8, (0, 1, 2, 4, 8))],
)
def test_worker_ladder_doubles_up_to_the_cores(cores: int, ladder: tuple[int, ...]) -> None:
    assert worker_ladder(cores) == ladder


def test_bottleneck_is_a_wait_above_the_threshold() -> None:
    assert not is_bottleneck(WAIT_SHARE_THRESHOLD)
    assert is_bottleneck(WAIT_SHARE_THRESHOLD + 1e-9)


class Loader:
    """A synthetic loader: each worker loads ``per_worker`` samples/s (the main process too, at
    0 workers, where loading and the step take turns), up to ``cores`` workers; the step trains
    ``step`` samples/s. Records the settings it was asked to measure."""

    def __init__(self, per_worker: float, step: float, cores: int) -> None:
        self.per_worker, self.step, self.cores = per_worker, step, cores
        self.asked: list[LoaderSetting] = []

    def measure(self, setting: LoaderSetting) -> SettingRow:
        self.asked.append(setting)
        workers = setting.num_workers
        if workers == 0:
            seconds = 1 / self.per_worker + 1 / self.step  # per sample, in turn
            return SettingRow(setting, 1 / seconds, (1 / self.per_worker) / seconds, 0.0)
        loading = self.per_worker * min(workers, self.cores)
        if workers > self.cores:
            loading *= 0.8  # oversubscribed
        rate = min(loading, self.step)
        wait = 0.0 if loading >= self.step else 1 - loading / self.step
        return SettingRow(setting, rate, wait, 0.05)


def test_the_ladder_stops_once_no_wait_is_left() -> None:
    loader = Loader(per_worker=100, step=250, cores=8)
    current = loader.measure(ZERO)
    rows, stop = try_settings(
        current,
        loader.measure,
        max_num_workers=8,
        knobs=("num_workers", "prefetch_factor"),
        cuda=False,
        tolerance=0.03,
    )
    # 1 and 2 workers still wait; 4 (400 samples/s of loading) keeps the step (250) busy.
    assert [r.setting.num_workers for r in rows] == [0, 1, 2, 4, 4]
    assert stop == "no_wait_left"
    assert rows[-1].setting == LoaderSetting(4, prefetch_factor=4)


def test_the_ladder_stops_when_more_workers_are_slower() -> None:
    loader = Loader(per_worker=100, step=10_000, cores=2)
    rows, stop = try_settings(
        loader.measure(ZERO),
        loader.measure,
        max_num_workers=8,
        knobs=("num_workers",),
        cuda=False,
        tolerance=0.03,
    )
    assert [r.setting.num_workers for r in rows] == [0, 1, 2, 4]  # 4 on 2 cores: 0.8x of 2
    assert stop == "slower_with_more_workers"


def test_only_the_knobs_the_loader_accepts_are_tried_and_pin_memory_only_on_cuda() -> None:
    loader = Loader(per_worker=100, step=10_000, cores=2)
    current = loader.measure(ZERO)
    every = ("num_workers", "prefetch_factor", "pin_memory", "persistent_workers")
    on_cpu, _ = try_settings(
        current, loader.measure, max_num_workers=2, knobs=every, cuda=False, tolerance=0.03
    )
    assert not any(r.setting.pin_memory for r in on_cpu)
    on_cuda, stop = try_settings(
        current, loader.measure, max_num_workers=2, knobs=every, cuda=True, tolerance=0.03
    )
    assert on_cuda[-1].setting == LoaderSetting(2, pin_memory=True)
    assert stop == "exhausted"
    assert not any(r.setting.persistent_workers for r in on_cuda)  # never timed: see startup_share
    bare, _ = try_settings(current, loader.measure, max_num_workers=2, knobs=(), cuda=True, tolerance=0.03)
    assert bare == (current,)


def test_the_current_setting_is_not_measured_again_and_the_time_budget_stops_it() -> None:
    loader = Loader(per_worker=100, step=10_000, cores=4)
    current = loader.measure(LoaderSetting(2))
    loader.asked.clear()
    answers = iter([False, True])
    rows, stop = try_settings(
        current,
        loader.measure,
        max_num_workers=4,
        knobs=("num_workers",),
        cuda=False,
        tolerance=0.03,
        fits=lambda setting, rows: not next(answers),
    )
    assert loader.asked == [ZERO]  # 2 was the current setting; the budget ran out before 1
    assert stop == "time_budget" and [r.setting.num_workers for r in rows] == [2, 0]


def test_not_a_bottleneck_gives_no_recommendation() -> None:
    current = row(wait=WAIT_SHARE_THRESHOLD)
    assert recommend(current, [current, row(4, 1000.0, 0.0)], tolerance=0.03, batch_size=32) is None


def test_the_cheapest_within_tolerance_of_the_fastest() -> None:
    current = row(0, 100.0, 0.6)
    rows = [current, row(1, 150.0, 0.4), row(2, 292.0, 0.05), row(4, 300.0, 0.01), row(8, 301.0, 0.0)]
    chosen = recommend(current, rows, tolerance=0.03, batch_size=32, knobs=("num_workers",))
    assert chosen is not None
    assert chosen.setting == LoaderSetting(2)  # 292 >= 0.97 x 301; 1 worker (150) is not
    assert chosen.gain == pytest.approx(2.92)
    assert chosen.summary() == (
        "use num_workers=2: 2.92x the samples/s measured (100.0 -> 292.0), "
        "the data wait 60% -> 5% of each step."
    )
    strict = recommend(current, rows, tolerance=0.0, batch_size=32, knobs=("num_workers",))
    assert strict is not None and strict.setting == LoaderSetting(8)


def test_ties_go_to_the_defaults() -> None:
    current = row(0, 100.0, 0.6)
    rows = [
        current,
        row(2, 300.0, 0.0, prefetch_factor=4),
        row(2, 300.0, 0.0, pin_memory=True),
        row(2, 300.0, 0.0),
    ]
    chosen = recommend(current, rows, tolerance=0.03, batch_size=32, knobs=("num_workers", "prefetch_factor"))
    assert chosen is not None and chosen.setting == LoaderSetting(2)


def test_keeping_the_current_setting_says_the_loading_itself_must_get_faster() -> None:
    current = row(2, 100.0, 0.5)
    rows = [current, row(0, 50.0, 0.7), row(1, 80.0, 0.6), row(4, 101.0, 0.5)]
    chosen = recommend(current, rows, tolerance=0.03, batch_size=32, knobs=("num_workers",))
    assert chosen is not None and chosen.setting == current.setting and chosen.gain == 1.0
    assert chosen.summary().startswith(
        "keep num_workers=2: no setting tried is faster by more than the tolerance"
    )


def test_persistent_workers_when_their_start_costs_more_than_the_tolerance_of_an_epoch() -> None:
    # 2 workers at 320 samples/s of batch 32: 0.1 s a batch; one worker's batch is 0.2 s of the start.
    slow_start = row(2, 320.0, 0.02, startup=1.2)
    assert startup_share(slow_start, 32, batches_per_epoch=100) == pytest.approx(1.0 / (1.0 + 10.0))
    assert startup_share(slow_start, 32, batches_per_epoch=None) is None
    assert startup_share(row(0, 320.0, 0.5, startup=1.2), 32, 100) is None
    assert startup_share(row(2, 320.0, 0.02, startup=0.1), 32, 100) == 0.0
    current = row(0, 100.0, 0.6)
    chosen = recommend(current, [current, slow_start], tolerance=0.03, batch_size=32, batches_per_epoch=100)
    assert chosen is not None and chosen.setting == LoaderSetting(2, persistent_workers=True)
    assert chosen.row is slow_start
    assert chosen.summary().endswith("saving their start (about 9% of an epoch).")
    long_epochs = recommend(
        current, [current, slow_start], tolerance=0.03, batch_size=32, batches_per_epoch=10_000
    )
    assert long_epochs is not None and not long_epochs.setting.persistent_workers
    refused = recommend(
        current,
        [current, slow_start],
        tolerance=0.03,
        batch_size=32,
        batches_per_epoch=100,
        knobs=("num_workers",),
    )
    assert refused is not None and not refused.setting.persistent_workers


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        (LoaderSetting(-1), "num_workers must be an integer >= 0, got -1."),
        (LoaderSetting(2, prefetch_factor=0), "prefetch_factor must be a positive integer or None, got 0."),
        (
            LoaderSetting(0, persistent_workers=True),
            (
                "persistent_workers=True needs num_workers > 0 (the DataLoader refuses it without "
                "workers); pass num_workers >= 1 or leave persistent_workers at its default."
            ),
        ),
    ],
)
def test_a_bad_setting_names_its_knob(setting: LoaderSetting, message: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        setting.check()
    assert str(info.value) == message


def test_a_bad_tolerance_is_refused() -> None:
    current = row()
    with pytest.raises(ConfigurationError, match=r"^tolerance=1.5 must be in \[0, 1\), e.g. 0.03 for 3%.$"):
        recommend(current, [current], tolerance=1.5, batch_size=32)


def test_the_setting_used_now_must_be_a_loader_setting() -> None:
    with pytest.raises(ConfigurationError) as info:
        LoaderSearch(current=4)  # type: ignore[arg-type]
    assert str(info.value) == (
        "LoaderSearch.current must be a LoaderSetting, got int (4); "
        "pass current=LoaderSetting(num_workers=...)."
    )
    assert LoaderSearch(current=LoaderSetting(num_workers=2)).current.num_workers == 2

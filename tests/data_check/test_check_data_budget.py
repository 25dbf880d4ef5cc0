"""``check_data`` within its time budget, on real DataLoaders and real steps: a budget too short for
every setting names the ones left with the seconds they would need and ends within it (plus the
batch in hand), and every pass is heard as it starts and at least every few seconds within it."""

from __future__ import annotations

import itertools
import time

import torch
from data_workloads import InMemoryItems, device_step, sleepy, tiny_model

from batchfit import Event, Timing, Workload, check_data
from batchfit.policy.explore.loader_budget import OUT_OF_TIME, settings_left
from batchfit.policy.explore.loader_settings import KNOBS, LoaderSearch, LoaderSetting
from batchfit.runtime.data.loop import PROGRESS_SECONDS


def test_a_short_budget_names_the_settings_left_and_the_check_ends_within_it(one_thread: None) -> None:
    # About 70 ms of loading and 50 ms of step a batch, in turn at 0 workers: the three passes
    # take about 1.5 s of windows, and each setting about 0.8 s more than the 2 s leave.
    budget = 2.0
    search = LoaderSearch(max_num_workers=2, window_seconds=0.4)
    result = check_data(sleepy(), 32, device="cpu", search=search, timing=Timing(time_budget_seconds=budget))
    assert result.bottleneck and result.stop_reason == "time_budget", result.table()
    left = settings_left(LoaderSetting(), result.settings, max_num_workers=2, knobs=KNOBS, cuda=False)
    assert [entry.part for entry in result.not_measured] == [setting.describe() for setting in left]
    assert result.not_measured and all(
        entry.reason == OUT_OF_TIME and (entry.needs_seconds or 0) > 0.4 for entry in result.not_measured
    ), result.table()
    # Within the budget, plus the batch in hand and a worker pool's start and shutdown at most.
    assert result.seconds <= budget + 1.0, result.table()
    document = result.to_dict()
    assert document["time_budget_seconds"] == budget
    assert document["not_measured"] == [entry.to_dict() for entry in result.not_measured]
    table = result.table()
    for entry in result.not_measured:
        assert entry.line() in table.splitlines()
    assert f"{len(result.not_measured)} not measured, about " in result.summary()


def test_every_pass_is_heard_as_it_starts_and_every_few_seconds_within_it(one_thread: None) -> None:
    # A step of 0.3 s on in-memory data: each pass's window (2.5 s) outlasts PROGRESS_SECONDS.
    step_seconds = 0.3
    model = tiny_model()
    workload = Workload(
        model=model,
        optimizer=torch.optim.Adam(model.parameters()),
        dataset=InMemoryItems(),
        train_step=device_step(step_seconds),
        name="slow step",
    )
    heard: list[tuple[float, Event]] = []
    started = time.perf_counter()
    result = check_data(
        workload,
        32,
        device="cpu",
        search=LoaderSearch(max_num_workers=0, window_seconds=2.5),
        timing=Timing(time_budget_seconds=60),
        on_progress=lambda event: heard.append((time.perf_counter(), event)),
    )
    ended = time.perf_counter()
    assert not result.bottleneck and result.not_measured == ()
    passes = [event for _, event in heard if event.stage == "started"]
    assert [event.message for event in passes] == [
        "the loader alone at num_workers=0",
        "the step alone",
        "the loader feeding the step at num_workers=0",
    ]
    assert all(event.label.endswith(" s of the time budget left)") for event in passes)
    notes = [event for _, event in heard if event.stage == "note"]
    # The two passes that step for 2.5 s are each heard within, saying the time left.
    for name in ("the step alone", "the loader feeding the step at num_workers=0"):
        assert any(event.label == name and "s of the time budget left" in event.message for event in notes)
    # No silence longer than PROGRESS_SECONDS and the step in hand (twice: a run of steps is told
    # at its end), with room for a loaded machine.
    times = [started] + [moment for moment, _ in heard] + [ended]
    gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
    assert max(gaps) < 2 * (PROGRESS_SECONDS + step_seconds) + 1.0, gaps


def test_without_a_bound_every_setting_is_measured_and_none_named(one_thread: None) -> None:
    search = LoaderSearch(max_num_workers=1, window_seconds=0.2)
    result = check_data(sleepy(), 32, device="cpu", search=search, timing=Timing(time_budget_seconds=None))
    assert result.bottleneck and result.stop_reason != "time_budget", result.table()
    assert [row.setting.num_workers for row in result.settings][:2] == [0, 1]
    assert result.time_budget_seconds is None and result.not_measured == ()
    assert result.to_dict()["not_measured"] == [] and "not measured" not in result.table()

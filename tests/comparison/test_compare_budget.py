"""compare within one time budget, on a real model whose step sleeps under autocast: a clearly
slower technique is reported at once, what the budget cannot pay for is named with its seconds,
the speed rounds speak and warm each row once."""

from __future__ import annotations

import time

from autocast_workloads import sleepy

from batchfit import BatchSizes, Timing, compare
from batchfit.comparison.measure import PROBE_STEPS
from batchfit.policy.explore.techniques import SLOW_STEP_RATIO
from batchfit.progress import Event

SIZES = BatchSizes(max_batch_size=64)


def test_a_clearly_slower_technique_is_reported_at_once_and_the_baseline_is_not() -> None:
    workload, model = sleepy(0.5)  # a baseline step on this busy machine stays far under 0.5 / 3 s
    result = compare(
        workload,
        ["amp"],
        device="cpu",
        memory_limit="64MiB",
        sizes=SIZES,
        timing=Timing(windows=1, time_budget_seconds=0),
    )
    baseline, amp = result.rows
    assert not baseline.slow and baseline.step_ratio is None and baseline.batch_size == 64
    assert amp.slow and amp.batch_size is None and amp.trials == 0
    assert amp.step_ratio is not None and amp.step_ratio >= SLOW_STEP_RATIO
    assert amp.throughput_ratio == 1 / amp.step_ratio
    assert amp.note.startswith(
        f"autocast bfloat16 runs {amp.step_ratio:.1f}x slower a step than the baseline"
    )
    assert "not searched (time_slow=True, --time-slow, measures it)" in amp.note
    # Only the probe stepped under autocast: no search, no speed round.
    assert 1 <= sum(autocast for _, autocast in model.calls) <= PROBE_STEPS
    assert amp.note in result.table() and result.to_dict()["rows"][1]["slow"] is True


def test_time_slow_searches_and_times_the_slow_technique() -> None:
    workload, _ = sleepy(0.2)
    timing = Timing(windows=1, steps_per_window=1, time_budget_seconds=0, time_slow=True)
    result = compare(workload, ["amp"], device="cpu", memory_limit="64MiB", sizes=SIZES, timing=timing)
    amp = result.rows[1]
    assert not amp.slow and amp.batch_size == 64 and amp.samples_per_second is not None
    assert amp.step_ratio is not None and amp.step_ratio >= SLOW_STEP_RATIO


def test_a_budget_that_runs_out_names_the_rows_left_with_their_seconds_and_ends_in_time() -> None:
    sleep_seconds, budget = 1.0, 12.0
    workload, _ = sleepy(sleep_seconds)
    timing = Timing(windows=3, time_budget_seconds=budget, time_slow=True)
    started = time.perf_counter()
    result = compare(
        workload, ["amp", "amp-fp16"], device="cpu", memory_limit="64MiB", sizes=SIZES, timing=timing
    )
    elapsed = time.perf_counter() - started
    left_out = {part.part: part for part in result.not_measured}
    # Each estimated at the baseline row's time x a step ratio in the hundreds: more than was left.
    assert {"amp", "amp-fp16"} <= set(left_out)
    for name in ("amp", "amp-fp16"):
        assert left_out[name].reason == "the time budget ran out"
        assert (left_out[name].needs_seconds or 0) > 3 * result.rows[0].seconds
        assert left_out[name].line() in result.table()
    assert [row.technique for row in result.rows] == ["baseline"]
    # Within the budget plus one slow step (the probes' sleeping steps fit in it).
    assert elapsed <= budget + sleep_seconds + 2.0
    assert result.to_dict()["not_measured"][0]["part"] == "amp"


def test_the_speed_rounds_speak_and_warm_each_row_once() -> None:
    workload, model = sleepy(0.0)
    events: list[Event] = []
    windows = 3
    timing = Timing(windows=windows, steps_per_window=1, time_budget_seconds=30, time_slow=True)
    marks: list[int] = []

    def hear(event: Event) -> None:
        events.append(event)
        if event.message.startswith("speed round") and not marks:
            marks.append(len(model.calls))

    result = compare(
        workload, ["amp"], device="cpu", memory_limit="64MiB", sizes=SIZES, timing=timing, on_progress=hear
    )
    rounds = [event.message for event in events if event.message.startswith("speed round")]
    assert [message.split(" (")[0] for message in rounds] == [
        f"speed round {number}/{windows}: {name}"
        for number in range(1, windows + 1)
        for name in ("baseline", "amp")
    ]
    assert all(message.endswith(" s left)") for message in rounds)
    # Per row: a warm-up step, a discarded window and a timed one in round 1, then one window a
    # round; every step at the row's largest batch, half of them under autocast.
    speed_calls = model.calls[marks[0] :]
    assert len(speed_calls) == 2 * (3 + windows - 1)
    assert {size for size, _ in speed_calls} == {64}
    assert sum(autocast for _, autocast in speed_calls) == 3 + windows - 1
    assert result.seconds_per_reading is not None and result.seconds_per_reading > 0
    assert "s of stepping per reading" in result.table()
    assert result.to_dict()["seconds_per_reading"] == result.seconds_per_reading


def test_advise_style_budget_zero_measures_every_row_without_explore() -> None:
    workload, _ = sleepy(0.0)
    timing = Timing(windows=1, time_budget_seconds=0, time_slow=True)
    result = compare(workload, ["amp"], device="cpu", memory_limit="64MiB", sizes=SIZES, timing=timing)
    assert [row.batch_size for row in result.rows] == [64, 64]
    assert all(row.recommended_batch_size is None for row in result.rows) and result.not_measured == ()

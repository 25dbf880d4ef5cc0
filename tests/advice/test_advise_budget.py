"""advise within one time budget, on a real model whose step sleeps under autocast: each step
starts only if it fits, what is left out is named with its seconds, and a clearly slower
technique is said to be slower, never advised and never counted as noise."""

from __future__ import annotations

import time

import data_workloads
from autocast_workloads import sleepy

from batchfit import BatchSizes, Timing, advise
from batchfit.advice.advise import Checklist
from batchfit.progress import Event

SIZES = BatchSizes(max_batch_size=64)


def test_a_clearly_slower_technique_is_listed_as_slower_not_ranked() -> None:
    workload, _ = sleepy(1.0)  # compare in advise probes at its own first batch (512 here)
    events: list[Event] = []
    result = advise(
        workload,
        device="cpu",
        memory_limit="64MiB",
        sizes=SIZES,
        checklist=Checklist(techniques=("amp",)),
        timing=Timing(windows=2, steps_per_window=1, time_budget_seconds=60),
        on_progress=events.append,
    )
    assert result.comparison is not None and result.comparison.rows[1].slow
    (slow,) = result.slower
    assert slow.clearly_slower and not slow.within_noise and slow.speedup is not None and slow.speedup < 1 / 3
    assert slow.evidence == "batchfit compare --techniques amp --time-slow"
    assert slow not in result.changes and slow not in result.within_noise and slow not in result.memory_only
    assert "clearly slower, not advised (one step several times the baseline's):" in result.table()
    assert result.to_dict()["slower"][0]["what"].startswith("amp (autocast bfloat16 runs ")
    started = [event.message for event in events if event.verb == "advise" and event.stage == "started"]
    assert started[0] == "find: 60 s left" or started[0].endswith(" s left")
    assert result.not_measured == ()


def test_a_budget_too_short_for_compare_names_it_with_its_seconds_and_ends_in_time() -> None:
    workload, _ = sleepy(0.0)
    budget = 0.01  # spent by find, which runs first whatever is left: nothing else fits
    started = time.perf_counter()
    result = advise(
        workload,
        device="cpu",
        memory_limit="64MiB",
        sizes=SIZES,
        checklist=Checklist(techniques=("amp",), skip=("explore",)),
        timing=Timing(windows=1, time_budget_seconds=budget),
    )
    elapsed = time.perf_counter() - started
    assert result.train is not None and result.eval is not None and result.comparison is None
    (left_out,) = result.not_measured
    assert (left_out.part, left_out.reason) == ("compare", "the time budget ran out")
    assert left_out.needs_seconds == 2 * result.train.search_seconds
    assert left_out.line() in result.table().splitlines()
    assert result.to_dict()["not_measured"] == [left_out.to_dict()]
    assert result.summary().endswith(" steps skipped, 1 out of time).")
    # Nothing started after find: the time is find's two searches and what surrounds them.
    assert elapsed <= budget + result.train.search_seconds + result.eval.search_seconds + 2.0


def test_check_data_keeps_to_what_advise_has_left() -> None:
    # A loader that sleeps a little per item: check-data alone would take its own 60 s default.
    budget = 14.0
    started = time.perf_counter()
    result = advise(
        data_workloads.sleepy(),
        device="cpu",
        checklist=Checklist(skip=("find", "explore", "compare", "plan"), batch_size=32),
        timing=Timing(time_budget_seconds=budget),
    )
    elapsed = time.perf_counter() - started
    assert result.data is not None and result.data.time_budget_seconds is not None
    assert result.data.time_budget_seconds <= budget
    # Within the budget, plus the batch in hand when it ran out (a few sleeping items).
    assert elapsed <= budget + 5.0

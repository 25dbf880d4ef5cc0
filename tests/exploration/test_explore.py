"""explore on a real tiny model: the path it takes, the constraints it honours, what it writes.

Throughput values are timing and not asserted; the policy is tested on scripted timings in
tests/policy/explore/test_exploration.py, the chooser on fixed curves in tests/policy/explore/test_choose.py.
"""

from __future__ import annotations

import csv
import io
import json
import math
import statistics
from dataclasses import replace
from typing import Any

import pytest
from tiny_workloads import build

from batchfit import BatchSizes, Goal, Timing
from batchfit.errors import ConfigurationError
from batchfit.exploration.explore import explore, explore_on, with_goodput
from batchfit.exploration.explore_result import ExploreResult
from batchfit.policy.explore.choose import Recommendation
from batchfit.policy.explore.contenders import coarse_sizes
from batchfit.policy.explore.exploration import Rules
from batchfit.policy.explore.throughput import Point
from batchfit.policy.explore.time_budget import TimeBudget
from batchfit.policy.noise.noise_scale import NoiseScale
from batchfit.progress import Event
from batchfit.where import target_of


def test_explores_up_to_the_memory_safe_bound_and_reports() -> None:
    workload = build("mlp", "sgd")
    before = [p.detach().clone() for p in workload.model.parameters()]
    updates = []
    result = explore(
        workload,
        device="cpu",
        memory_limit=1_600_000,
        on_progress=lambda event: (
            updates.append(event.recommendation) if event.stage == "recommendation" else None
        ),
        timing=Timing(windows=3, steps_per_window=2),
    )
    batches = [point.batch_size for point in result.points]
    # Coarse: powers of two up to the bound that find_batch_size found, which is measured too.
    assert {1, 2, 4, 8, 16, 32, 64} <= set(batches) and max(batches) == result.max_batch_size
    coarse = coarse_sizes(list(range(1, result.max_batch_size + 1)), None)
    assert len(batches) <= len(coarse) + Rules().max_refinements
    assert result.recommendation.batch_size in batches and result.history[-1] == result.recommendation
    assert len(updates) == len(result.history) >= len(batches)
    # The coarse pass: each size alone, from the largest down, in a round of its own: 3 windows in
    # a row, or 1 when that one read below far_below of the fastest before it. (Which sizes those
    # are depends on this machine's timings: tests/policy/explore/test_exploration.py scripts them.)
    first_round = {point.batch_size: point.rounds[0] for point in result.points if point.batch_size in coarse}
    assert sorted(first_round, key=first_round.__getitem__) == sorted(coarse, reverse=True)
    in_coarse: dict[int, int] = {}
    fastest = 0.0
    for batch in sorted(coarse, reverse=True):
        point = next(p for p in result.points if p.batch_size == batch)
        alone = [
            v for v, r in zip(point.samples_per_second, point.rounds, strict=True) if r == point.rounds[0]
        ]
        in_coarse[batch] = len(alone)
        assert len(alone) == (1 if alone[0] < Rules().far_below * fastest else 3)
        fastest = max(fastest, statistics.median(alone))
    assert in_coarse[result.max_batch_size] == 3  # the first measured has nothing to be far below
    # Then rounds over the contenders: one window each (3 for a size new to the rounds, a
    # refinement), at least two sizes per round (so the drift can be taken out), never more rounds
    # than the cap.
    members: dict[int, list[int]] = {}
    for point in result.points:
        for index, r in enumerate(point.rounds):
            if point.batch_size not in coarse or index >= in_coarse[point.batch_size]:
                members.setdefault(r, []).append(point.batch_size)
    assert len(members) <= Rules().max_focus_rounds
    assert all(len(set(sizes)) >= 2 for sizes in members.values())
    assert all(sizes.count(batch) in (1, 3) for sizes in members.values() for batch in sizes)
    assert result.stop_reason in ("confident", "exhausted") and members
    # Settled or a leaning, as the confidence says (timings decide which; the policy's tests script both).
    settled = result.recommendation.settled
    assert (result.unsettled is None) == settled == (result.recommendation.confidence >= 50)
    head = "Current recommended micro_batch_size: " if settled else "No micro_batch_size settled: leaning to "
    assert result.recommendation.line().startswith(
        f"{head}{result.recommendation.batch_size}, estimated performance: "
    )
    document = json.loads(result.to_json())
    assert [p["batch_size"] for p in document["points"]] == batches
    assert [p["rounds"] for p in document["points"]] == [list(point.rounds) for point in result.points]
    assert {p["batch_size"]: p["estimate"] for p in document["points"]} == result.estimates()
    assert len(document["points"][0]["samples_per_second"]) == len(result.points[0].samples_per_second)
    rows = list(csv.DictReader(io.StringIO(result.to_csv())))
    assert [int(row["batch_size"]) for row in rows] == batches
    assert ("<- recommended" if settled else "<- leaning, not settled") in result.table()
    for a, b in zip(before, workload.model.parameters(), strict=True):  # the model is left as it was
        assert a.equal(b)


def test_global_batch_constraint_and_time_budget() -> None:
    result = explore(
        build("mlp"),
        device="cpu",
        sizes=BatchSizes(max_batch_size=48, world_size=2, global_batch_size=96),
        timing=Timing(windows=2, steps_per_window=1, time_budget_seconds=0.0),
    )
    # 96 / 2 devices = 48 per device: every micro-batch measured divides 48.
    assert all(48 % point.batch_size == 0 for point in result.points)
    assert result.stop_reason == "time_budget" and len(result.points) == 1  # the budget stops it at once


def test_too_little_time_gives_a_leaning_not_an_answer() -> None:
    """A real run out of time after its first size: the recommendation is only a leaning, and
    the result names the size measured and the time that would settle it, in every output."""
    result = explore(
        build("mlp"),
        device="cpu",
        sizes=BatchSizes(max_batch_size=64),
        timing=Timing(windows=2, steps_per_window=1, time_budget_seconds=0.0),
    )
    doubt = result.unsettled
    assert result.stop_reason == "time_budget" and doubt is not None
    assert result.recommendation.batch_size == doubt.leaning == 64 and result.recommendation.confidence == 0
    assert doubt.measured == (64,) and doubt.more_seconds is not None and doubt.more_seconds > 0
    assert doubt.budget_seconds == pytest.approx(result.explore_seconds + doubt.more_seconds)
    lines = result.table().splitlines()
    assert lines[1].endswith("<- leaning, not settled")
    assert lines[2] == (
        "No micro_batch_size settled: leaning to 64, estimated performance: 1.00x base, confidence score: 0 "
        "(out of 100), below 50: the measurements do not yet tell the sizes apart"
    )
    assert lines[3] == doubt.line() and lines[3].startswith(
        f"measured 64; about {math.ceil(doubt.more_seconds)} s more of timing would settle it "
        f"(time_budget_seconds about {math.ceil(doubt.budget_seconds or 0)}): the 6 coarse sizes not "
        f"timed yet"
    )
    document = json.loads(result.to_json())
    assert document["unsettled"] == {
        "confidence": 0,
        "floor": 50,
        "leaning": 64,
        "measured": [64],
        "more_seconds": doubt.more_seconds,
        "budget_seconds": doubt.budget_seconds,
        "how": doubt.how,
    }
    assert document["recommendation"]["batch_size"] == 64  # programs reading the field keep working


def test_what_the_budget_left_out_is_named_and_every_visit_is_told() -> None:
    """A real run out of time after its first size names the 6 coarse sizes it left, each with the
    seconds it would need, in the result, its dict and its table; progress notes say the phase,
    the size and the time left before each visit; the cost per reading counts every step."""
    events: list[Event] = []
    result = explore(
        build("mlp"),
        device="cpu",
        sizes=BatchSizes(max_batch_size=64),
        timing=Timing(windows=2, steps_per_window=1, time_budget_seconds=0.0),
        on_progress=events.append,
    )
    left = [32, 16, 8, 4, 2, 1]  # the coarse sizes after 64, largest first as the pass goes
    assert sorted((part.part for part in result.not_measured), key=lambda p: -int(p.split()[-1])) == [
        f"batch size {batch}" for batch in left
    ]
    assert all(part.needs_seconds is not None and part.needs_seconds > 0 for part in result.not_measured)
    assert json.loads(result.to_json())["not_measured"] == [part.to_dict() for part in result.not_measured]
    assert all(part.line() in result.table().splitlines() for part in result.not_measured)
    assert "not measured: batch size 1, batch size 2" in result.summary()
    notes = [
        event.message for event in events if event.stage == "note" and "batch size " in event.message[:40]
    ]
    assert notes == ["coarse pass, size 1 of 7: batch size 64; 0 s left"]
    # The budget, spent, ends the visit after its first window (a warm-up and a discarded one before it).
    assert result.readings == 1 and result.timing_seconds > 0
    assert result.seconds_per_reading == result.timing_seconds
    assert json.loads(result.to_json())["seconds_per_reading"] == result.seconds_per_reading

    events.clear()
    whole = explore(
        build("mlp"),
        device="cpu",
        sizes=BatchSizes(max_batch_size=8),
        timing=Timing(windows=2, steps_per_window=1),
        on_progress=events.append,
    )
    notes = [
        event.message for event in events if event.stage == "note" and "batch size " in event.message[:40]
    ]
    assert whole.not_measured == () and len(notes) >= len(whole.points)
    assert notes[0] == "coarse pass, size 1 of 4: batch size 8; no time budget"
    assert whole.readings == sum(len(point.samples_per_second) for point in whole.points)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"world_size": 8, "global_batch_size": 1001},
            "global_batch_size (1001) is not divisible by world_size (8); 1000 or 1008 would work.",
        ),
        ({"windows": 1}, "windows must be at least 2"),
        ({"tolerance": 3}, "tolerance=3 must be in [0, 1)"),
        ({"confidence_target": 101}, "confidence_target=101 must be in [0, 100]"),
        (
            {"max_batch_size": 10, "multiple_of": 16},
            "no multiple of 16 lies in [min_batch_size, max_batch_size] = [1, 10]",
        ),
        (
            {"max_batch_size": 10, "multiple_of": 4, "world_size": 2, "global_batch_size": 36},
            "no micro-batch in [1, 10] satisfies multiple_of=4 and global_batch_size=36 / world_size=2;",
        ),
        ({"max_batch_size": 0}, "max_batch_size must be a positive integer, got 0."),
        ({"min_batch_size": 0}, "min_batch_size must be a positive integer, got 0."),
        (
            {"min_batch_size": 20},
            "min_batch_size (20) is larger than max_batch_size (16); pass min_batch_size <= max_batch_size.",
        ),
        ({"multiple_of": -8}, "multiple_of must be a positive integer, got -8."),
        ({"global_batch_size": 0}, "global_batch_size must be a positive integer, got 0."),
    ],
)
def test_bad_input(kwargs: dict[str, object], message: str) -> None:
    given = {"max_batch_size": 16, **kwargs}
    with pytest.raises(ConfigurationError) as info:
        options = {
            name: kind(**{key: value for key, value in given.items() if key in kind.__dataclass_fields__})
            for name, kind in (("sizes", BatchSizes), ("timing", Timing), ("goal", Goal))
        }
        explore(build("mlp"), device="cpu", **options)  # type: ignore[arg-type]
    assert message in str(info.value)


def test_a_single_window_shows_no_spread() -> None:
    """A size timed in one window has no spread: the table prints ``-``, the JSON null and the CSV
    an empty cell, where 0.0% would read as a perfectly steady size."""
    once = Point(64, (1000.0,), (0,))
    thrice = Point(32, (900.0, 1000.0, 1100.0), (1, 1, 1))
    assert once.spread is None and thrice.spread == pytest.approx(0.2)
    result = ExploreResult(
        (thrice, once),
        Recommendation(64, 64, 32, 1.0, 0),
        (Recommendation(64, 64, 32, 1.0, 0),),
        64,
        "samples/s",
        "time_budget",
        2.0,
        "cpu",
    )
    rows = result.table().splitlines()
    assert rows[1].split()[3:] == ["20.0%", "3"] and rows[2].split()[3:5] == ["-", "1"]
    assert [point["spread"] for point in json.loads(result.to_json())["points"]] == [0.2, None]
    assert [row["spread"] for row in csv.DictReader(io.StringIO(result.to_csv()))] == ["0.2000", ""]


def test_a_noise_scale_predicts_each_measured_batch_to_a_target_from_the_estimates() -> None:
    measured = NoiseScale(16.0, 10.0, 30.0, 8, 4, 32, 1.0, 16.0)
    result = explore(
        build("mlp", "sgd"),
        device="cpu",
        sizes=BatchSizes(max_batch_size=32),
        timing=Timing(windows=2, steps_per_window=1, time_budget_seconds=1),
        goal=Goal(noise_scale=measured, sample_tolerance=0.2),
    )
    analysis = result.goodput
    assert analysis is not None and analysis.measured and analysis.sample_tolerance == 0.2
    estimated = result.estimates()
    assert {row.batch_size: row.samples_per_second for row in analysis.rows} == estimated
    assert analysis.time_optimal == min(estimated, key=lambda size: ((size + 16) / estimated[size], size))
    assert analysis.fastest == max(estimated, key=lambda size: (estimated[size], -size))
    assert (analysis.noise_scale_low, analysis.noise_scale_high) == (10.0, 30.0)
    document = json.loads(result.to_json())
    assert document["goodput"]["time_optimal"] == analysis.time_optimal
    assert document["goodput"]["lines"] == analysis.lines()
    assert result.table().endswith(analysis.table())
    # The seam a measured noise scale comes in by: the same analysis on the result without one.
    plain = replace(result, goodput=None)
    assert with_goodput(plain, measured, sample_tolerance=0.2) == result
    assert json.loads(plain.to_json())["goodput"] is None and "goodput" not in plain.table()


def test_a_noise_scale_with_a_fixed_global_batch_is_refused_before_any_work() -> None:
    with pytest.raises(ConfigurationError) as error:
        explore(
            build("mlp", "sgd"),
            device="cpu",
            sizes=BatchSizes(max_batch_size=32, global_batch_size=64, world_size=1),
            goal=Goal(noise_scale=100.0),
        )
    assert str(error.value) == (
        "noise_scale weighs the batch of an optimizer step against its steps, and global_batch_size=64 "
        "fixes that batch: every micro-batch explored trains it, and the fastest is the quickest to a "
        "target. Leave out one of the two."
    )


@pytest.mark.parametrize(
    ("goal", "message"),
    [
        (
            lambda: Goal(noise_scale=0.0),
            (
                "noise_scale must be a positive number of samples (inf: the noise hid the signal), got "
                "0.0; a measured noise scale of 0 or less says the noise did not show at the batches "
                "measured: measure it at smaller batches."
            ),
        ),
        (lambda: Goal(sample_tolerance=-0.1), "sample_tolerance must be a non-negative number, got -0.1."),
    ],
)
def test_a_goal_checks_its_noise_scale_when_made(goal: Any, message: str) -> None:
    with pytest.raises(ConfigurationError) as error:
        goal()
    assert str(error.value) == message


def test_an_outer_verb_s_budget_part_bounds_explore_on() -> None:
    """compare and advise give explore a part of their own budget: spent, it stops explore after
    its first window, whatever ``timing`` says."""
    target = target_of("explore", None, {"device": "cpu"})
    spent = TimeBudget(0.0)
    result = explore_on(
        target,
        build("mlp"),
        BatchSizes(max_batch_size=64),
        Timing(windows=2, steps_per_window=1),
        budget=spent,
    )
    assert result.stop_reason == "time_budget" and result.readings == 1
    assert [part.part for part in result.not_measured][-1] == "batch size 32"

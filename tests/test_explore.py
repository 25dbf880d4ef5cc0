"""explore on a real tiny model: the path it takes, the constraints it honours, what it writes.

Throughput values are timing and not asserted; the chooser itself is tested on fixed curves in
tests/test_choose.py.
"""

from __future__ import annotations

import csv
import importlib
import io
import json
import statistics

import pytest
from conftest import build

from batchfit.choose import Point, Recommendation
from batchfit.errors import ConfigurationError
from batchfit.explore import (
    FAR_BELOW,
    KEEP_CHANCE,
    MAX_FOCUS_ROUNDS,
    MAX_REFINEMENTS,
    SETTLED_ROUNDS,
    _coarse,
    _focus,
    _lone_dips,
    _Meter,
    _refinement,
    explore,
)


def test_explores_up_to_the_memory_safe_bound_and_reports() -> None:
    workload = build("mlp", "sgd")
    before = [p.detach().clone() for p in workload.model.parameters()]
    updates = []
    result = explore(
        workload,
        device="cpu",
        memory_limit=1_600_000,
        windows=3,
        steps_per_window=2,
        on_update=updates.append,
    )
    batches = [point.batch_size for point in result.points]
    # Coarse: powers of two up to the bound that find_batch_size found, which is measured too.
    assert {1, 2, 4, 8, 16, 32, 64} <= set(batches) and max(batches) == result.max_batch_size
    assert len(batches) <= len(_coarse(list(range(1, result.max_batch_size + 1)), None)) + MAX_REFINEMENTS
    assert result.recommendation.batch_size in batches and result.history[-1] == result.recommendation
    assert len(updates) == len(result.history) >= len(batches)
    coarse = _coarse(list(range(1, result.max_batch_size + 1)), None)
    # The coarse pass: each size alone, from the largest down, in a round of its own: 3 windows in
    # a row, or 1 when that one read below FAR_BELOW of the fastest before it (batch 1 of this
    # mlp runs at about a fortieth of the bound's throughput).
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
        assert len(alone) == (1 if alone[0] < FAR_BELOW * fastest else 3)
        fastest = max(fastest, statistics.median(alone))
    assert in_coarse[1] == 1 and in_coarse[result.max_batch_size] == 3
    assert len(result.points[0].samples_per_second) == 1  # batch 1 is not measured again
    # Then rounds over the contenders: one window each, at least two sizes per round (so the drift
    # can be taken out), never more rounds than the cap.
    members: dict[int, list[int]] = {}
    for point in result.points:
        for index, r in enumerate(point.rounds):
            if point.batch_size not in coarse or index >= in_coarse[point.batch_size]:
                members.setdefault(r, []).append(point.batch_size)
    assert len(members) <= MAX_FOCUS_ROUNDS
    assert all(len(sizes) == len(set(sizes)) >= 2 for sizes in members.values())
    assert result.stop_reason in ("confident", "exhausted") and members
    assert result.recommendation.line().startswith(
        f"Current recommended micro_batch_size: {result.recommendation.batch_size}, estimated performance: "
    )
    document = json.loads(result.to_json())
    assert [p["batch_size"] for p in document["points"]] == batches
    assert [p["rounds"] for p in document["points"]] == [list(point.rounds) for point in result.points]
    assert {p["batch_size"]: p["estimate"] for p in document["points"]} == result.estimates()
    assert len(document["points"][0]["samples_per_second"]) == len(result.points[0].samples_per_second)
    rows = list(csv.DictReader(io.StringIO(result.to_csv())))
    assert [int(row["batch_size"]) for row in rows] == batches
    assert "<- recommended" in result.table()
    for a, b in zip(before, workload.model.parameters(), strict=True):  # the model is left as it was
        assert a.equal(b)


def test_contenders_and_refinements() -> None:
    measured = [1, 2, 4, 8, 16, 32, 64]
    current = Recommendation(batch_size=8, best_batch_size=32, base_batch_size=1, speedup=3.0, confidence=50)
    # The recommendation and the size below it; the fastest and the size above it.
    assert _focus(measured, current) == {4, 8, 32, 64}
    top = Recommendation(batch_size=64, best_batch_size=64, base_batch_size=1, speedup=3.0, confidence=50)
    assert _focus(measured, top) == {32, 64}
    # And any size that may still be within the tolerance: a former fastest two sizes away stays
    # compared with the recommendation in the same rounds.
    middle = Recommendation(batch_size=16, best_batch_size=16, base_batch_size=1, speedup=3.0, confidence=50)
    assert _focus(measured, middle, {8: 0.0, 16: 0.7, 32: 0.1, 64: 0.3}) == {8, 16, 32, 64}
    assert _focus(measured, middle, {8: 0.0, 16: 0.7, 32: 0.1, 64: KEEP_CHANCE / 2}) == {8, 16, 32}
    candidates = list(range(1, 65))
    # The smallest-within rule refines below the recommendation only (where its answer may lie) ...
    # The roundest size in between, nearest the geometric middle: 12 between 8 and 16, 48 between
    # 32 and 64, 36 among multiples of 3 between 24 and 48.
    assert _refinement(candidates, measured, 16, "smallest-within-tolerance") == 12
    assert _refinement(candidates, measured, 64, "smallest-within-tolerance") == 48
    assert _refinement(list(range(3, 49, 3)), [24, 48], 48, "smallest-within-tolerance") == 36
    assert _refinement(candidates, [4, 5, 16], 5, "smallest-within-tolerance") is None
    # ... max-throughput on both sides, below first.
    assert _refinement(candidates, [4, 5, 16], 5, "max-throughput") == 8
    assert _refinement([1, 2, 4, 8], [1, 2, 4, 8], 2, "max-throughput") is None


def test_a_lone_dip_is_compared_again() -> None:
    """The transformer's coarse pass in one bench run: 32 read 0.84 of the best in a round of its
    own, between 16 and 64 (compared in rounds, 0.92). A dip that recovers is more likely a slow
    spell than the batch size: it is flagged, and no longer once compared in a round."""
    coarse = {8: 30000.0, 16: 31000.0, 32: 26000.0, 64: 30500.0, 128: 27000.0}

    def points(checked: bool) -> list[Point]:
        found = []
        for index, (batch, rate) in enumerate(coarse.items()):
            rounds = (index, index)
            if batch in (16, 64) or (checked and batch == 32):
                rounds = (index, 10)  # the second window in a shared round
            found.append(Point(batch, (rate, rate * 1.01), rounds))
        return found

    assert _lone_dips(points(checked=False)) == {32}
    assert _lone_dips(points(checked=True)) == set()
    # The ends of the range and sizes on a falling or rising stretch are not dips.
    falling = ((1, 5.0), (2, 9.0), (4, 8.0), (8, 7.0))
    assert _lone_dips([Point(b, (r,), (i,)) for i, (b, r) in enumerate(falling)]) == set()


def test_explore_compares_a_lone_dip_before_it_stops(monkeypatch: pytest.MonkeyPatch) -> None:
    """The real loop on a real model, with the throughput readings scripted (a slow spell cannot be
    summoned on demand): a plateau from 8 to 64, where 32's coarse windows ran in a spell 20%
    slow. 32 is neither a contender nor next to one, yet it is compared in a round."""

    def plateau(batch: int) -> float:
        return 1000.0 * min(1.0, batch / 8) ** 0.7 * (0.9 if batch >= 128 else 0.99 if batch >= 64 else 1.0)

    readings: dict[int, int] = {}
    real_window = _Meter.window

    def scripted(meter: _Meter, batch_size: int) -> float:
        real_window(meter, batch_size)  # the step still runs on the real model
        count = readings[batch_size] = readings.get(batch_size, 0) + 1
        spell = 0.8 if batch_size == 32 and count <= 2 else 1.0
        return plateau(batch_size) * spell * (1 + 0.002 * (count % 3 - 1))

    monkeypatch.setattr(_Meter, "window", scripted)
    result = explore(build("mlp"), device="cpu", max_batch=128, windows=2, steps_per_window=1)
    rounds = {point.batch_size: set(point.rounds) for point in result.points}
    others = set().union(*(own for batch, own in rounds.items() if batch != 32))
    assert rounds[32] & others  # compared with others in a round
    assert readings[32] > 2
    assert result.recommendation.batch_size == 8


def test_a_confident_answer_is_confirmed_by_one_more_round(monkeypatch: pytest.MonkeyPatch) -> None:
    """The real loop on a real model, with the readings scripted: a clear knee at 8. The stop comes
    SETTLED_ROUNDS rounds after the confidence first reached its target, not at that first
    crossing (checked after every round, a single crossing is too often a lucky one)."""

    def knee(batch: int) -> float:
        return 1000.0 * min(1.0, batch / 8) ** 0.7

    readings: dict[int, int] = {}
    real_window = _Meter.window

    def scripted(meter: _Meter, batch_size: int) -> float:
        real_window(meter, batch_size)  # the step still runs on the real model
        count = readings[batch_size] = readings.get(batch_size, 0) + 1
        return knee(batch_size) * (1 + 0.002 * (count % 3 - 1))

    monkeypatch.setattr(_Meter, "window", scripted)
    module = importlib.import_module("batchfit.explore")  # the package's "explore" is the function
    monkeypatch.setattr(module, "FOCUS_TIME_FACTOR", 100.0)  # the rounds' time cap is not under test
    coarse = len(_coarse(list(range(1, 65)), None))
    focus_rounds = {}
    for settled in (1, SETTLED_ROUNDS):
        monkeypatch.setattr(module, "SETTLED_ROUNDS", settled)
        result = explore(build("mlp"), device="cpu", max_batch=64, windows=2, steps_per_window=1)
        assert result.stop_reason == "confident" and result.recommendation.batch_size == 8
        focus_rounds[settled] = max(r for point in result.points for r in point.rounds) + 1 - coarse
    assert SETTLED_ROUNDS == 2 and focus_rounds[2] == focus_rounds[1] + 1


def test_global_batch_constraint_and_time_budget() -> None:
    result = explore(
        build("mlp"),
        device="cpu",
        max_batch=48,
        world_size=2,
        global_batch=96,
        windows=2,
        steps_per_window=1,
        time_budget=0.0,
    )
    # 96 / 2 devices = 48 per device: every micro-batch measured divides 48.
    assert all(48 % point.batch_size == 0 for point in result.points)
    assert result.stop_reason == "time_budget" and len(result.points) == 1  # the budget stops it at once


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"world_size": 8, "global_batch": 1001},
            "global_batch (1001) is not divisible by world_size (8); 1000 or 1008 would work.",
        ),
        ({"windows": 1}, "windows must be at least 2"),
        ({"tolerance": 3}, "tolerance=3 must be in [0, 1)"),
        ({"confidence_target": 101}, "confidence_target=101 must be in [0, 100]"),
        (
            {"max_batch": 10, "multiple_of": 16},
            "no micro-batch in [1, 10] satisfies multiple_of=16; loosen one or widen the range.",
        ),
        (
            {"max_batch": 10, "multiple_of": 4, "world_size": 2, "global_batch": 36},
            "no micro-batch in [1, 10] satisfies multiple_of=4 and global_batch=36 / world_size=2;",
        ),
        ({"max_batch": 0}, "max_batch must be a positive integer, got 0."),
        ({"min_batch": 0}, "min_batch must be a positive integer, got 0."),
        ({"min_batch": 20}, "min_batch (20) is larger than max_batch (16); pass min_batch <= max_batch."),
        ({"multiple_of": -8}, "multiple_of must be a positive integer, got -8."),
        ({"global_batch": 0}, "global_batch must be a positive integer, got 0."),
    ],
)
def test_bad_input(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        explore(build("mlp"), device="cpu", **{"max_batch": 16, **kwargs})  # type: ignore[arg-type]
    assert message in str(info.value)

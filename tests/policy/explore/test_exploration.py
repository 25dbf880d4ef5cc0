"""Explore's policy on scripted timings: which sizes it times, in which rounds, when it stops.

The meters here script the throughput (a slow spell cannot be summoned on demand) while a real
StepTimer runs the steps on a real tiny model: the policy cannot tell them from real windows.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import pytest
from tiny_workloads import build

from batchfit.errors import ConfigurationError
from batchfit.policy.explore.contenders import coarse_sizes
from batchfit.policy.explore.exploration import Rules, explore_rounds
from batchfit.policy.plan.micro_batch import micro_batch_sizes
from batchfit.runtime.devices.device import CpuDevice
from batchfit.runtime.steps.timer import StepTimer


class ScriptedMeter:
    """Real steps on a real model through a StepTimer, with scripted throughput readings:
    ``reading(batch_size, count)`` for the ``count``-th window at that size."""

    def __init__(self, timer: StepTimer, reading: Callable[[int, int], float]) -> None:
        self.timer, self.reading = timer, reading
        self.readings: dict[int, int] = {}

    def first_visit(self, batch_size: int) -> None:
        self.timer.first_visit(batch_size)

    def revisit(self, batch_size: int) -> None:
        self.timer.revisit(batch_size)

    def window(self, batch_size: int) -> float:
        self.timer.window(batch_size)  # the step still runs on the real model
        count = self.readings[batch_size] = self.readings.get(batch_size, 0) + 1
        return self.reading(batch_size, count)

    def end_round(self) -> None:
        self.timer.end_round()

    def now(self) -> float:
        return self.timer.now()


class ModelledMeter:
    """No model at all: a throughput curve and a clock that advances by the modelled step time."""

    def __init__(self, curve: Callable[[int], float]) -> None:
        self.curve, self.clock = curve, 0.0
        self.visits: list[tuple[str, int]] = []

    def first_visit(self, batch_size: int) -> None:
        self.visits.append(("first", batch_size))
        self.clock += 2 * batch_size / self.curve(batch_size)

    def revisit(self, batch_size: int) -> None:
        self.visits.append(("again", batch_size))
        self.clock += batch_size / self.curve(batch_size)

    def window(self, batch_size: int) -> float:
        wobble = 1 + 0.002 * (len(self.visits) % 3 - 1)
        self.visits.append(("window", batch_size))
        self.clock += batch_size / self.curve(batch_size)
        return self.curve(batch_size) * wobble

    def end_round(self) -> None:
        self.clock += 0.005

    def now(self) -> float:
        return self.clock


class NoisyMeter(ModelledMeter):
    """The modelled meter with log-normal noise on each window (seeded: the same every run)."""

    def __init__(self, curve: Callable[[int], float], noise: float, seed: int) -> None:
        super().__init__(curve)
        self.noise, self.rng = noise, random.Random(seed)

    def window(self, batch_size: int) -> float:
        return super().window(batch_size) * math.exp(self.rng.gauss(0, self.noise))


def knee(batch: int) -> float:
    return 1000.0 * min(1.0, batch / 8) ** 0.7


def scripted(reading: Callable[[int, int], float], max_batch_size: int, rules: Rules) -> tuple:
    with StepTimer(build("mlp"), CpuDevice(), steps_per_window=1) as timer:
        meter = ScriptedMeter(timer, reading)
        return explore_rounds(micro_batch_sizes(1, max_batch_size), meter, rules), meter.readings


def test_explore_compares_a_lone_dip_before_it_stops() -> None:
    """A plateau from 8 to 64, where 32's coarse windows ran in a spell 20% slow. 32 is neither a
    contender nor next to one, yet it is compared in a round."""

    def plateau(batch: int) -> float:
        return 1000.0 * min(1.0, batch / 8) ** 0.7 * (0.9 if batch >= 128 else 0.99 if batch >= 64 else 1.0)

    def reading(batch_size: int, count: int) -> float:
        spell = 0.8 if batch_size == 32 and count <= 2 else 1.0
        return plateau(batch_size) * spell * (1 + 0.002 * (count % 3 - 1))

    result, readings = scripted(reading, 128, Rules(windows=2))
    rounds = {point.batch_size: set(point.rounds) for point in result.points}
    others = set().union(*(own for batch, own in rounds.items() if batch != 32))
    assert rounds[32] & others  # compared with others in a round
    assert readings[32] > 2
    assert result.recommendation.batch_size == 8


def test_a_confident_answer_is_confirmed_by_one_more_round() -> None:
    """A clear knee at 8. The stop comes ``settled_rounds`` rounds after the confidence first
    reached its target, not at that first crossing (checked after every round, a single crossing
    is too often a lucky one)."""

    def reading(batch_size: int, count: int) -> float:
        return knee(batch_size) * (1 + 0.002 * (count % 3 - 1))

    coarse = len(coarse_sizes(list(range(1, 65)), None))
    focus_rounds = {}
    for settled in (1, Rules().settled_rounds):
        # The rounds' time cap is not under test.
        rules = Rules(windows=2, settled_rounds=settled, focus_time_factor=100.0)
        result, _ = scripted(reading, 64, rules)
        assert result.stop_reason == "confident" and result.recommendation.batch_size == 8
        focus_rounds[settled] = max(r for point in result.points for r in point.rounds) + 1 - coarse
    assert Rules().settled_rounds == 2 and focus_rounds[2] == focus_rounds[1] + 1


def test_the_policy_is_deterministic_on_a_modelled_clock() -> None:
    """With the meter's own clock, the same timings give the same exploration, every run: the
    time budget and the rounds' time cap read that clock, never the machine's."""
    first, again = ModelledMeter(knee), ModelledMeter(knee)
    rules = Rules(time_budget_seconds=10.0, focus_time_factor=100.0)
    one, two = explore_rounds(range(1, 65), first, rules), explore_rounds(range(1, 65), again, rules)
    assert one == two and first.visits == again.visits
    assert one.recommendation.batch_size == 8 and one.stop_reason == "confident"
    assert one.recommendation.settled and one.unsettled is None
    assert one.seconds == pytest.approx(first.clock)
    # Every size is first visited once, the coarse sizes from the largest down: 3 windows in a
    # row, or 1 for a size far below the fastest before it (1 and 2, at 0.23 and 0.38 of 64's
    # throughput), which is not measured again.
    firsts = [batch for kind, batch in first.visits if kind == "first"]
    assert len(firsts) == len(set(firsts)) and firsts[:7] == [64, 32, 16, 8, 4, 2, 1]
    windows = {point.batch_size: len(point.samples_per_second) for point in one.points}
    assert windows[1] == windows[2] == 1 and min(windows[b] for b in (4, 8, 16, 32, 64)) >= 3


def test_the_time_budget_is_read_on_the_meter_s_clock() -> None:
    meter = ModelledMeter(knee)
    result = explore_rounds(range(1, 65), meter, Rules(time_budget_seconds=0.0))
    assert result.stop_reason == "time_budget" and [p.batch_size for p in result.points] == [64]
    started_late = explore_rounds(
        range(1, 65), ModelledMeter(knee), Rules(time_budget_seconds=5.0), started=-10.0
    )
    assert started_late.stop_reason == "time_budget" and len(started_late.points) == 1


def test_too_short_a_budget_leaves_a_leaning_and_names_the_budget_that_settles_it() -> None:
    """Out of time after the first coarse size: confidence 0 is not an answer. The result names
    what was measured and the rest of explore's plan: the 6 coarse sizes left (63 samples in all)
    at the 5 ms per sample that 64's visit took (2 steps' warm-up and 3 windows, 0.32 s on the
    modelled clock), then rounds at their cap of 0.5 times the coarse pass. That budget, given,
    settles on what an unlimited run recommends, in less time than that run took."""
    short = explore_rounds(range(1, 65), ModelledMeter(knee), Rules(time_budget_seconds=0.0))
    doubt = short.unsettled
    assert short.stop_reason == "time_budget" and not short.recommendation.settled and doubt is not None
    assert (doubt.confidence, doubt.floor, doubt.leaning, doubt.measured) == (0, 50, 64, (64,))
    assert doubt.more_seconds == pytest.approx(63 * 0.005 + 0.5 * (0.32 + 63 * 0.005))
    assert doubt.budget_seconds == pytest.approx(short.seconds + doubt.more_seconds)
    assert doubt.line() == (
        "measured 64; about 1 s more of timing would settle it (time_budget_seconds about 1): the 6 "
        "coarse sizes not timed yet, at the 5.0 ms per sample that 64 took, then rounds over the "
        "contenders of up to 0.5 times the coarse pass."
    )
    unlimited = explore_rounds(range(1, 65), ModelledMeter(knee), Rules())
    again = explore_rounds(range(1, 65), ModelledMeter(knee), Rules(time_budget_seconds=doubt.budget_seconds))
    assert (
        again.unsettled is None
        and again.recommendation.batch_size == unlimited.recommendation.batch_size == 8
    )
    # An unlimited run spends rounds confirming a sure answer past the rounds' cap, which the
    # estimate leaves out: the budget it names settles it in less than that run took.
    assert 0.5 < doubt.budget_seconds / unlimited.seconds < 1.0


def test_rounds_that_end_unsure_estimate_the_time_from_the_spread() -> None:
    """The knee (flat from 8) under 30% noise per window, the rounds capped at one: the confidence
    ends under 50. The spread so far says how many times the windows would reach the target (the
    standard errors shrink by its square root); that many times the timing so far, given as the
    budget, settles it. Where even 64 times would not, the result says so and names no time."""
    rules = Rules(max_focus_rounds=1)
    short = explore_rounds(range(1, 65), NoisyMeter(knee, 0.3, seed=6), rules)
    doubt = short.unsettled
    assert short.stop_reason == "exhausted" and doubt is not None and doubt.confidence < 50
    assert doubt.more_seconds is not None and doubt.how.startswith(
        "the spread measured so far needs about 16 times the windows to reach the confidence target of 90"
    )
    longer = Rules(time_budget_seconds=doubt.budget_seconds, max_focus_rounds=10_000, focus_time_factor=1e3)
    again = explore_rounds(range(1, 65), NoisyMeter(knee, 0.3, seed=6), longer)
    assert again.stop_reason == "time_budget" and again.unsettled is None
    hopeless = explore_rounds(range(1, 65), NoisyMeter(knee, 0.3, seed=24), rules).unsettled
    assert hopeless is not None and hopeless.more_seconds is None and hopeless.budget_seconds is None
    assert hopeless.line().endswith(
        "even 64 times the windows, at the spread measured so far, would not reach the confidence target "
        "of 90: the leading sizes may sit at the edge of the tolerance (0.03), where no amount of timing "
        "tells them apart; a wider tolerance would."
    )


@pytest.mark.parametrize(
    ("rules", "message"),
    [
        (Rules(windows=1), "windows must be at least 2 (a spread needs two), got 1."),
        (Rules(tolerance=3), "tolerance=3 must be in [0, 1)"),
        (Rules(confidence_target=101), "confidence_target=101 must be in [0, 100]"),
        (Rules(time_budget_seconds=-1.0), "time_budget_seconds must be 0 or more, got -1.0."),
    ],
)
def test_bad_rules_fail_before_anything_is_timed(rules: Rules, message: str) -> None:
    meter = ModelledMeter(knee)
    with pytest.raises(ConfigurationError) as info:
        explore_rounds(range(1, 9), meter, rules)
    assert message in str(info.value) and meter.visits == []


@pytest.mark.parametrize("budget", [0.1, 0.3, 0.6])
def test_a_budget_is_kept_and_what_it_left_out_is_named(budget: float) -> None:
    """No visit starts that the budget left cannot pay for (a first visit to a size costs 2 steps'
    warm-up and its windows), and a visit ends between windows once the budget is spent: the run
    ends within the budget (or the first window) plus one window of the largest size,
    and names each coarse size it left, with the seconds it would need (its samples at the
    seconds per sample of the smallest size timed)."""
    meter = ModelledMeter(knee)
    result = explore_rounds(range(1, 65), meter, Rules(time_budget_seconds=budget))
    assert result.stop_reason == "time_budget"
    first_visit = 3 * 64 / knee(64)  # the first window always runs, after 2 steps' warm-up
    assert result.seconds <= max(budget, first_visit) + 64 / knee(64)
    timed = [point.batch_size for point in result.points]
    left = [batch for batch in coarse_sizes(list(range(1, 65)), None) if batch not in timed]
    assert [part.part for part in result.not_measured] == [f"batch size {batch}" for batch in left]
    smallest = min(timed)
    per_sample = (2 + 3) / knee(smallest)  # its warm-up and 3 windows, per sample
    for part, batch in zip(result.not_measured, left, strict=True):
        assert part.reason == "the time budget ran out"
        assert part.needs_seconds == pytest.approx(batch * per_sample)
    unlimited = explore_rounds(range(1, 65), ModelledMeter(knee), Rules())
    assert unlimited.not_measured == () and unlimited.stop_reason == "confident"


def test_the_cost_per_reading_counts_every_step_of_the_visits() -> None:
    """The readings are the windows read; their cost is the meter's clock in visits (warm-ups,
    revisits' untimed steps and windows), not the chooser's work between rounds."""
    meter = ModelledMeter(knee)
    result = explore_rounds(range(1, 65), meter, Rules())
    windows = sum(1 for kind, _ in meter.visits if kind == "window")
    assert result.readings == windows == sum(len(p.samples_per_second) for p in result.points)
    rounds = max(r for point in result.points for r in point.rounds) + 1
    assert result.timing_seconds == pytest.approx(meter.clock - 0.005 * rounds)


def test_every_visit_is_told_first_with_its_phase_and_the_time_left() -> None:
    """A note before each visit (so a terminal hears something at least once a visit): the coarse
    pass's sizes in order, then the rounds, each with the budget left on the meter's clock."""
    notes: list[str] = []
    meter = ModelledMeter(knee)
    result = explore_rounds(range(1, 65), meter, Rules(time_budget_seconds=60.0), on_note=notes.append)
    firsts = sum(1 for kind, _ in meter.visits if kind in ("first", "again"))
    assert len(notes) == firsts
    assert notes[0] == "coarse pass, size 1 of 7: batch size 64; 60 s left"
    assert notes[6].startswith("coarse pass, size 7 of 7: batch size 1; ") and notes[6].endswith(" s left")
    assert all(note.startswith("round ") and note.endswith(" s left") for note in notes[7:])
    assert len(notes) > 7 and result.stop_reason == "confident"
    unbounded: list[str] = []
    explore_rounds(range(1, 65), ModelledMeter(knee), Rules(), on_note=unbounded.append)
    assert unbounded[0] == "coarse pass, size 1 of 7: batch size 64; no time budget"

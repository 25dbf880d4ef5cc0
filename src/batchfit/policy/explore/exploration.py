"""Explore's policy, free of torch: which batch sizes to time, in which rounds, and when to stop.

It asks a ``Meter`` for timing windows and reads its clock; the torch edge's ``StepTimer`` times
real steps, and a replay (``bench/explore_replay.py``) or a test gives modelled ones. The
algorithm, with the reasons for each rule, is in ``docs/explore.md``.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Literal, Protocol

from batchfit.checks import check_positive_int
from batchfit.errors import ConfigurationError
from batchfit.policy.explore.choose import Objective, Recommendation, confidences, recommend
from batchfit.policy.explore.contenders import KEEP_CHANCE, coarse_sizes, focus_sizes, lone_dips, refinement
from batchfit.policy.explore.settling import Aims, Effort, Unsettled, left_out, unsettled
from batchfit.policy.explore.throughput import Point
from batchfit.policy.explore.time_budget import NotMeasured

ExploreStopReason = Literal["confident", "time_budget", "exhausted"]


class Meter(Protocol):
    """Timing windows at batch sizes, and the clock the policy reads."""

    def first_visit(self, batch_size: int) -> None:
        """Prepare a batch size seen for the first time (a warm-up step, a discarded window)."""

    def revisit(self, batch_size: int) -> None:
        """Prepare a batch size again after another ran (one untimed step)."""

    def window(self, batch_size: int) -> float:
        """One timing window's throughput at ``batch_size`` (samples or tokens per second)."""
        ...

    def end_round(self) -> None:
        """A round is over (the edge may put the weights back)."""

    def now(self) -> float:
        """Seconds on the clock the time budget is read against."""
        ...


@dataclass(frozen=True)
class Rules:
    """What the exploration aims at, and the limits of its rounds."""

    tolerance: float = 0.03  # within this share of the best counts as as fast
    objective: Objective = "smallest-within-tolerance"
    base_batch_size: int | None = None  # the speed-up's base (default: the smallest measured)
    confidence_target: int = 90  # 0-100: stop once the recommendation is this sure
    windows: int = 3  # windows per batch size in the coarse pass
    time_budget_seconds: float | None = None
    max_refinements: int = 0  # sizes added between the recommendation and a measured neighbour
    max_focus_rounds: int = 16  # rounds over the contenders before stopping unsettled
    focus_time_factor: float = 0.5  # ... or once they took this many times the coarse pass's time
    keep_chance: float = KEEP_CHANCE  # a size this likely to be within the tolerance stays in the rounds
    settled_rounds: int = 2  # rounds in a row at the target before stopping confident
    far_below: float = 0.95  # coarse pass: a first window under this share of the fastest is enough

    def check(self) -> None:
        """Raise a ConfigurationError naming the first unusable rule."""
        check_positive_int("windows", self.windows)
        if self.windows < 2:
            raise ConfigurationError(f"windows must be at least 2 (a spread needs two), got {self.windows}.")
        if self.base_batch_size is not None:
            check_positive_int("base_batch_size", self.base_batch_size)
        if self.time_budget_seconds is not None and not self.time_budget_seconds >= 0:
            raise ConfigurationError(
                f"time_budget_seconds must be 0 or more, got {self.time_budget_seconds!r}."
            )
        # The chooser's own checks: tolerance, objective, confidence target.
        recommend(
            (), tolerance=self.tolerance, objective=self.objective, confidence_target=self.confidence_target
        )


@dataclass(frozen=True)
class Exploration:
    """What the policy measured and concluded."""

    points: tuple[Point, ...]
    history: tuple[Recommendation, ...]  # the live recommendation after each measurement
    stop_reason: ExploreStopReason
    seconds: float  # on the meter's clock, from ``started``
    unsettled: Unsettled | None = None  # under the confidence floor: what was measured, what would settle it
    timing_seconds: float = 0.0  # in visits: warm-ups, untimed steps and windows
    readings: int = 0  # timing windows read
    not_measured: tuple[NotMeasured, ...] = ()  # what the time budget left out

    @property
    def recommendation(self) -> Recommendation:
        return self.history[-1]


def explore_rounds(
    candidates: Sequence[int],
    meter: Meter,
    rules: Rules = Rules(),
    *,
    started: float | None = None,
    on_update: Callable[[Recommendation], None] | None = None,
    on_note: Callable[[str], None] | None = None,
) -> Exploration:
    """Time ``candidates`` through ``meter`` and recommend one, following ``rules``.

    A coarse pass times the powers of two, the bound and the base, largest first. Then the
    contenders are timed in rounds, one window each, so that a slow spell hits them alike; sizes
    are added between the recommendation and its neighbour. It stops confident, out of time
    (``time_budget_seconds`` after ``started``, default now), or exhausted. A recommendation
    under the confidence floor comes with ``unsettled``: what was measured, what would settle it.
    No visit starts whose expected cost exceeds the budget left; ``not_measured`` names what that
    left out. ``on_note`` hears, before each visit, the phase, the size and the time left.
    """
    rules.check()
    if not candidates:
        raise ConfigurationError("candidates is empty: give at least one batch size to explore.")
    return _Explorer(
        sorted(candidates), meter, rules, meter.now() if started is None else started, on_update
    ).run(on_note)


class _Explorer:
    """One exploration's state: what was measured, in which round, and the recommendations so far."""

    def __init__(
        self,
        candidates: list[int],
        meter: Meter,
        rules: Rules,
        started: float,
        on_update: Callable[[Recommendation], None] | None,
    ) -> None:
        self.candidates, self.meter, self.rules, self.started = candidates, meter, rules, started
        self.on_update = on_update
        self.measured: dict[int, list[tuple[int, float]]] = {}  # batch -> (round, throughput) per window
        self.history: list[Recommendation] = []
        self.far: set[int] = set()  # sizes measured once in the coarse pass, far slower than the fastest
        self.rounds = 0
        self.timing_seconds = 0.0  # in visits, on the meter's clock
        self.coarse_timed: list[tuple[int, float]] = []  # (batch, seconds) of each coarse visit
        self.sample_seconds = 0.0  # the most seconds per sample a window slot has cost so far
        self.on_note: Callable[[str], None] | None = None

    def run(self, on_note: Callable[[str], None] | None = None) -> Exploration:
        self.on_note = on_note
        reason: ExploreStopReason = "exhausted"
        coarse_started = self.meter.now()
        coarse = coarse_sizes(self.candidates, self.rules.base_batch_size)
        if not self.coarse_pass(coarse):
            reason = "time_budget"
        else:
            focus_ends = self.meter.now() + self.rules.focus_time_factor * (self.meter.now() - coarse_started)
            reason = self.focus(focus_ends)
        seconds = self.meter.now() - self.started
        left = tuple(batch for batch in coarse if batch not in self.measured)
        effort = Effort(seconds, self.timing_seconds, tuple(self.coarse_timed), left)
        points = tuple(self.points())
        rules = self.rules
        aims = Aims(rules.tolerance, rules.objective, rules.confidence_target, rules.focus_time_factor)
        doubt = unsettled(self.history[-1], points, effort, aims)
        missing = left_out(effort, doubt, reason == "time_budget")
        readings = sum(len(point.samples_per_second) for point in points)
        return Exploration(
            points, tuple(self.history), reason, seconds, doubt, self.timing_seconds, readings, missing
        )

    def focus(self, focus_ends: float) -> ExploreStopReason:
        """Rounds over the contenders until the recommendation is settled or a limit is reached."""
        rules = self.rules
        refinements = focus_rounds = settled = 0
        while True:
            current = self.history[-1]
            fresh = {batch for batch, values in self.measured.items() if len(values) < rules.windows}
            fresh = (fresh | lone_dips(self.points())) - self.far
            gap = refinement(self.candidates, sorted(self.measured), current.batch_size, rules.objective)
            if self.out_of_time():
                return "time_budget"
            # Refine, or stop confident, only once the coarse answer has been compared with the
            # fastest in a round: a slow spell during the coarse pass must not decide either.
            refine = gap is not None and refinements < rules.max_refinements and focus_rounds > 0
            sure = (
                not refine
                and focus_rounds > 0
                and not fresh
                and current.confidence >= rules.confidence_target
            )
            settled = settled + 1 if sure else 0
            if refine and gap is not None:
                refinements += 1
                fresh.add(gap)
            elif settled >= rules.settled_rounds:
                return "confident"
            # A sure answer gets the round that confirms it even at the caps (one round more).
            elif not sure and (focus_rounds >= rules.max_focus_rounds or self.meter.now() > focus_ends):
                return "exhausted"
            focus_rounds += 1
            chances = confidences(self.points(), tolerance=rules.tolerance)
            contenders = focus_sizes(sorted(self.measured), current, chances, rules.keep_chance)
            if not self.run_round(contenders | fresh):
                return "time_budget"

    def points(self) -> list[Point]:
        return [
            Point(batch, tuple(rate for _, rate in windows), tuple(r for r, _ in windows))
            for batch, windows in sorted(self.measured.items())
            if windows
        ]

    def out_of_time(self, expected_seconds: float = 0.0) -> bool:  # or too little left for it
        budget = self.rules.time_budget_seconds
        return budget is not None and self.meter.now() - self.started + expected_seconds > budget

    def note(self, phase: str, batch: int) -> None:  # the phase and size next, and the time left
        budget, spent = self.rules.time_budget_seconds, self.meter.now() - self.started
        left = "no time budget" if budget is None else f"{max(0.0, budget - spent):.0f} s left"
        if self.on_note is not None:
            self.on_note(f"{phase}: batch size {batch}; {left}")

    def update(self, finished: bool, covered: bool = True) -> None:
        """Recommend from what is measured; tell ``on_update`` when the recommendation changed."""
        rules = self.rules
        current = recommend(
            self.points(),
            tolerance=rules.tolerance,
            objective=rules.objective,
            base_batch_size=rules.base_batch_size,
            confidence_target=rules.confidence_target,
        )
        if current is not None and not covered:  # the best may lie in what is not measured yet
            current = replace(current, confidence=0)
        if current is not None and (not self.history or current != self.history[-1] or finished):
            self.history.append(current)
            if self.on_update is not None:
                self.on_update(current)

    def visit(self, batch: int, count: int, floor: float = 0.0, phase: str = "") -> bool:
        """``count`` windows at ``batch`` in the current round, or one when the first reads below
        ``floor``; False when the budget left is under the visit's expected cost (the seconds per
        sample of the costliest visit so far, for ``count`` windows and a warm-up's worth more); the
        first window always runs, and the budget ends a visit between windows."""
        if self.measured and self.out_of_time(self.sample_seconds * batch * (count + 1)):
            return False
        self.note(phase, batch)
        started = self.meter.now()
        if batch not in self.measured:
            self.meter.first_visit(batch)
            self.measured[batch] = []
        else:
            self.meter.revisit(batch)
        for index in range(count):
            self.measured[batch].append((self.rounds, self.meter.window(batch)))
            if index == 0 and self.measured[batch][-1][1] < floor:
                self.far.add(batch)
                break
            if self.out_of_time():  # the budget ends a visit between windows
                break
        seconds = self.meter.now() - started
        self.timing_seconds += seconds
        self.sample_seconds = max(self.sample_seconds, seconds / (batch * (index + 2)))
        return True

    def coarse_pass(self, batches: list[int]) -> bool:
        """Each batch size on its own, from the largest down, ``windows`` windows in a row, or one
        for a size whose first reads below ``far_below`` of the fastest so far."""
        fastest = 0.0
        for batch in reversed(batches):
            before = self.timing_seconds
            phase = f"coarse pass, size {len(self.coarse_timed) + 1} of {len(batches)}"
            finished = self.visit(batch, self.rules.windows, self.rules.far_below * fastest, phase)
            if finished:  # a visit the budget cut short, scaled to a whole one (a warm-up ~ 2 windows)
                taken, windows = len(self.measured[batch]), self.rules.windows
                whole = 1 if batch in self.far else (windows + 2) / (taken + 2)
                self.coarse_timed.append((batch, whole * (self.timing_seconds - before)))
            self.end_round()
            self.update(finished, covered=batch == batches[0])
            if not finished:
                return False
            fastest = max(fastest, statistics.median(rate for _, rate in self.measured[batch]))
        return True

    def run_round(self, batches: set[int]) -> bool:
        """One window per batch size, in alternating order (a drift within the round hits both
        ends alike), so the chooser can divide the round's common factor out."""
        order = sorted(batches, reverse=self.rounds % 2 == 1)
        # A size new to the rounds (a refinement) gets the coarse pass's windows, to settle by the cap.
        finished = all(
            self.visit(b, 1 if b in self.measured else self.rules.windows, 0.0, f"round {self.rounds + 1}")
            for b in order
        )
        self.end_round()
        self.update(finished)
        return finished

    def end_round(self) -> None:
        self.meter.end_round()
        self.rounds += 1

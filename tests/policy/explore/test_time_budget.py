"""The time budget every timing verb keeps, on a clock the test moves."""

from __future__ import annotations

import math

import pytest

from batchfit.errors import ConfigurationError
from batchfit.policy.explore.time_budget import NotMeasured, TimeBudget


class Clock:
    def __init__(self) -> None:
        self.seconds = 100.0

    def __call__(self) -> float:
        return self.seconds


def test_a_budget_counts_from_when_it_is_made_and_allows_what_still_fits() -> None:
    clock = Clock()
    budget = TimeBudget(60.0, clock)
    clock.seconds += 45
    assert budget.spent() == 45 and budget.left() == 15
    assert budget.allows(15) and not budget.allows(15.5)
    clock.seconds += 30
    assert budget.left() == 0 and not budget.allows(0.1)


def test_no_bound_allows_everything_and_its_parts_are_unbounded_too() -> None:
    budget = TimeBudget(None, Clock())
    assert budget.left() == math.inf and budget.allows(1e9)
    assert budget.part(0.5).seconds is None


def test_a_part_is_a_share_of_what_is_left_on_the_same_clock() -> None:
    clock = Clock()
    budget = TimeBudget(100.0, clock)
    clock.seconds += 20
    part = budget.part(0.25)
    assert part.seconds == 20 and part.clock is clock
    clock.seconds += 5
    assert part.left() == 15
    with pytest.raises(ValueError, match=r"share must be in \(0, 1\], got 0"):
        budget.part(0)


def test_a_negative_budget_is_refused_naming_the_option() -> None:
    with pytest.raises(ConfigurationError, match="time_budget_seconds"):
        TimeBudget(-1.0, Clock())


def test_what_was_not_measured_says_why_and_what_it_would_need() -> None:
    left = NotMeasured("amp+checkpointing", "the time budget ran out", 39.2)
    assert (
        left.line()
        == "amp+checkpointing: not measured (the time budget ran out); about 40 s would measure it."
    )
    assert NotMeasured("explore", "skipped").line() == "explore: not measured (skipped)."
    assert left.to_dict() == {
        "part": "amp+checkpointing",
        "reason": "the time budget ran out",
        "needs_seconds": 39.2,
    }

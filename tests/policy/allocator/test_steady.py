"""When a trial's later steps can only repeat its earlier ones (no torch): the allocator state
after a step recurs, and every step of the cycle ran as the next ones will."""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import pytest

from batchfit.policy.allocator.steady import RecurrenceWatch


def watch_over(
    states: Sequence[Hashable | None], stepped: Sequence[bool] | None = None, *, training: bool = True
) -> tuple[int, int] | None:
    """(the step that ended the trial, the step whose state it repeated), or None: ran them all."""
    watch = RecurrenceWatch(needs_optimizer_step=training)
    for step, state in enumerate(states, start=1):
        earlier = watch.after_step(state, True if stepped is None else stepped[step - 1])
        if earlier is not None:
            return step, earlier
    return None


@pytest.mark.parametrize(
    ("states", "expected"),
    [
        (["a", "a"], (2, 1)),  # period 1 from the first step
        (["a", "b", "b"], (3, 2)),  # the first step differs (optimizer state created)
        (["a", "b", "c", "b"], (4, 2)),  # period 2
        (["a", "b", "c", "d", "e", "c"], (6, 3)),  # period 3 after two settling steps
        (["a", "b", "c", "d", "e"], None),  # still settling: every step must run
    ],
)
def test_the_trial_ends_at_the_first_state_seen_before(
    states: list[str], expected: tuple[int, int] | None
) -> None:
    assert watch_over(states) == expected


def test_a_step_without_an_optimizer_step_is_no_part_of_a_cycle() -> None:
    # A GradScaler skips optimizer.step while the scale is too large: the optimizer state does not
    # exist yet, so steps that repeat one another then prove nothing about the steps after.
    assert watch_over(["a", "a", "a", "b", "b"], [False, False, False, True, True]) == (5, 4)
    # Skipped inside what would be a cycle: a cycle counts only from the step after it.
    skipped_third = [True, True, False, True, True, True]
    assert watch_over(["a", "b", "a", "b", "a"], skipped_third[:5]) is None
    assert watch_over(["a", "b", "a", "b", "a", "b"], skipped_third) == (6, 4)
    assert watch_over(["a", "a", "a"], [False, False, False]) is None


def test_evaluation_needs_no_optimizer_step() -> None:
    assert watch_over(["a", "a"], [False, False], training=False) == (2, 1)


def test_an_unknown_state_never_ends_a_trial() -> None:
    # The CPU's tracker has no allocator state: its trials run every step asked.
    assert watch_over([None, None, None, None]) is None
    assert watch_over(["a", None, "a", "a"]) == (4, 3)  # not across the unknown step

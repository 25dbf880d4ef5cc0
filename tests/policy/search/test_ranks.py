"""The trial the ranks of a lockstep search agree on, from each rank's own (no torch)."""

from __future__ import annotations

import pytest

from batchfit.policy.search.ranks import merge_trials
from batchfit.policy.search.trial import Trial


def _trial(outcome: str, peak: int, seconds: float | None, detail: str = "") -> Trial:
    return Trial(64, outcome, peak, seconds, detail, reserved_peak_bytes=peak + 10)  # type: ignore[arg-type]


def test_merge_takes_any_failure_the_largest_peak_and_the_slowest_step() -> None:
    merged = merge_trials([_trial("ok", 100, 0.2), _trial("ok", 150, 0.3)])
    assert (merged.outcome, merged.peak_bytes, merged.step_seconds, merged.reserved_peak_bytes) == (
        "ok",
        150,
        0.3,
        160,
    )
    merged = merge_trials([_trial("ok", 100, 0.2), _trial("oom", 90, None, "out of memory")])
    assert (merged.outcome, merged.detail, merged.step_seconds) == ("oom", "rank 1: out of memory", None)
    merged = merge_trials([_trial("over_budget", 120, 0.2, "over"), _trial("oom", 90, None, "oom")])
    assert merged.outcome == "oom" and merged.detail == "rank 1: oom"
    with pytest.raises(ValueError, match="out of step"):
        merge_trials([_trial("ok", 1, 0.1), Trial(65, "ok", 1, 0.1)])


def test_a_failure_on_another_rank_brings_its_steps() -> None:
    # Rank 0 ended its 10 steps early at a recurrence; rank 1 ran out at its 7th step.
    ended_early = Trial(64, "ok", 100, 0.2, steps=4, steady_from=3)
    ran_out = Trial(64, "oom", 90, None, "out of memory", steps=10, failed_at_step=7)
    merged = merge_trials([ended_early, ran_out])
    assert (merged.outcome, merged.steps, merged.steady_from, merged.failed_at_step) == ("oom", 10, None, 7)

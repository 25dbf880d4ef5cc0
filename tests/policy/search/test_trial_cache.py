"""The trial cache: a measurement made under one budget's cap, judged again under another."""

from __future__ import annotations

import pytest

from batchfit.policy.search.trial import Trial
from batchfit.policy.search.trial_cache import TrialCache

MiB = 2**20


def cache_with(trial: Trial, cap: int) -> TrialCache:
    cache = TrialCache()
    cache.real[trial.batch_size] = (trial, cap)
    return cache


@pytest.mark.parametrize(
    ("budget", "outcome"),
    [
        (120 * MiB, "ok"),  # a larger cap than it fitted under
        (100 * MiB, "ok"),  # the same
        (95 * MiB, "ok"),  # smaller, but above all it reserved: the allocator never reached it
        (85 * MiB, None),  # between allocated and reserved: only running it again can tell
        (70 * MiB, "over_budget"),  # below what it allocated: it cannot fit
    ],
)
def test_a_trial_that_fitted_is_judged_by_its_peaks(budget: int, outcome: str | None) -> None:
    fitted = Trial(32, "ok", 80 * MiB, 0.1, reserved_peak_bytes=90 * MiB)
    reused = cache_with(fitted, 100 * MiB).lookup_real(32, budget)
    assert (reused.outcome if reused else None) == outcome
    if reused is not None:
        assert reused.reused and reused.peak_bytes == 80 * MiB


def test_without_a_cache_the_allocated_peak_decides() -> None:
    fitted = Trial(32, "ok", 80 * MiB, 0.1)  # the CPU: storages are allocated as they are counted
    cache = cache_with(fitted, 100 * MiB)
    assert cache.lookup_real(32, 80 * MiB).outcome == "ok"  # type: ignore[union-attr]
    assert cache.lookup_real(32, 80 * MiB - 1).outcome == "over_budget"  # type: ignore[union-attr]


@pytest.mark.parametrize(("budget", "outcome"), [(90 * MiB, "oom"), (100 * MiB, "oom"), (101 * MiB, None)])
def test_a_trial_that_ran_out_fails_any_budget_as_small(budget: int, outcome: str | None) -> None:
    failed = Trial(48, "oom", 99 * MiB, None, "out of memory")
    reused = cache_with(failed, 100 * MiB).lookup_real(48, budget)
    assert (reused.outcome if reused else None) == outcome


def test_traces_are_judged_against_any_budget() -> None:
    cache = TrialCache()
    cache.predicted[16] = Trial(16, "over_budget", 50 * MiB, None)
    assert cache.lookup_predicted(16, 60 * MiB).outcome == "ok"  # type: ignore[union-attr]
    assert cache.lookup_predicted(16, 40 * MiB).outcome == "over_budget"  # type: ignore[union-attr]
    assert cache.lookup_predicted(17, 40 * MiB) is None

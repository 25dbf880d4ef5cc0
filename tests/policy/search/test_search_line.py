"""The search's own strategies (the opening, the line, the safe step), each against brute force."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest

from batchfit.policy.search.search_line import follow_line, local_model, next_index, open_search, safe_step
from batchfit.policy.search.search_state import DEFAULT_TUNING, Candidates, SearchState
from batchfit.policy.search.trial import Trial


def up_to(truth: int, per_sample: int = 1000, fixed: int = 0) -> Callable[[int], Trial]:
    """Trials on a device where batches up to ``truth`` fit: a line of peaks, out of memory past it."""

    def run(batch: int) -> Trial:
        if batch > truth:
            return Trial(batch, "oom", 0, None, "out of memory")
        return Trial(batch, "ok", fixed + per_sample * batch, 0.01)

    return run


def state_for(run: Callable[[int], Trial], candidates: Candidates, budget_bytes: int = 10**12) -> SearchState:
    return SearchState(run, candidates, budget_bytes, DEFAULT_TUNING)


def truth_index(truth: int, candidates: Candidates) -> int:
    """The brute force: the index of the largest candidate that fits (-1: none)."""
    return max((i for i in range(candidates.count) if candidates.batch(i) <= truth), default=-1)


@pytest.mark.parametrize("multiple_of", [None, 3])
@pytest.mark.parametrize("truth", [0, 1, 2, 3, 5, 8, 11, 40])
def test_the_opening_brackets_the_truth(truth: int, multiple_of: int | None) -> None:
    # About 2x the smallest candidate, then 4x where that fitted, else the smallest.
    candidates = Candidates.between(1, 64, multiple_of)
    state = state_for(up_to(truth), candidates)
    opened = open_search(state, seed=None)
    best = truth_index(truth, candidates)
    assert opened == (best >= 0)
    assert state.low <= best and (state.high is None or state.high > best)
    if opened:
        assert state.at[state.low].fits
    smallest = candidates.first
    double, quadruple = (candidates.batch(candidates.index_at_most(k * smallest)) for k in (2, 4))
    expected = [double, quadruple] if double <= truth else [double, smallest]
    assert [trial.batch_size for trial in state.trials] == expected


def test_a_seed_that_fails_refutes_the_prior_and_the_opening_below_it_confirms() -> None:
    candidates = Candidates.between(1, 64)
    prior = Trial(30, "ok", 1, None)  # predicted, not run
    state = state_for(up_to(20), candidates)
    state.longer = up_to(20)
    state.known = {candidates.index_at_most(30): prior}
    state.aiming = True
    assert open_search(state, seed=40)
    assert [t.batch_size for t in state.trials] == [40, 2, 4]
    assert prior not in state.known.values() and state.high == candidates.index_at_most(40)
    assert state.ran_longer == {candidates.index_at_most(b) for b in (40, 2, 4)}


@pytest.mark.parametrize("distrust", [False, True])
def test_the_safe_step_alone_finds_the_truth_in_logarithmically_many_trials(distrust: bool) -> None:
    candidates = Candidates.between(1, 300)
    for truth in range(1, 301):
        state = state_for(up_to(truth), candidates)
        state.low, state.distrust = 0, distrust
        while state.stop_reason() is None:
            index = safe_step(state)
            assert state.low < index and (state.high is None or index < state.high)
            if state.probe(index).fits:
                state.low = index
                state.stride *= 2
            else:
                state.high = index
        assert state.low == truth_index(truth, candidates)
        assert len(state.trials) <= 2 * math.ceil(math.log2(candidates.count)) + 2


@pytest.mark.parametrize("margin", [0.0, 0.02, 0.1])
def test_a_line_through_two_trials_of_a_linear_curve_aims_at_the_truth(margin: float) -> None:
    candidates, budget = Candidates.between(1, 10_000), 100_000_000
    run = up_to(10**9, per_sample=37_000, fixed=1_000_000)
    state = state_for(run, candidates, budget)
    state.low = candidates.index_at_most(4)
    state.known = {candidates.index_at_most(b): run(b) for b in (2, 4)}
    state.model = local_model(state)
    truth = (budget * (1 - margin) - 1_000_000) // 37_000  # the largest batch under the aim, by force
    assert next_index(state, margin) == (truth_index(int(truth), candidates), True)


def test_where_the_interval_stops_halving_the_line_gives_way_to_bisection() -> None:
    candidates, budget = Candidates.between(1, 10_000), 100_000_000
    run = up_to(10**9, per_sample=37_000, fixed=1_000_000)
    state = state_for(run, candidates, budget)
    state.low, state.high = candidates.index_at_most(4), 3000
    state.known = {candidates.index_at_most(b): run(b) for b in (2, 4)}
    state.model = local_model(state)
    guess = candidates.index_at_most((budget - 1_000_000) // 37_000)
    state.widths = [4000, 2500, 1900]  # halving over two trials: the line's guess
    assert next_index(state, 0.0) == (guess, True)
    state.widths = [4000, 2500, 2100]  # not halving: the middle
    assert next_index(state, 0.0) == ((state.low + state.high) // 2, False)


def test_the_line_goes_through_the_largest_fit_and_the_steepest_far_trial() -> None:
    # The slope grows with the batch: of the trials at most near of the largest's size (or
    # near_rise of its peak) below it, the nearest gives the steepest line.
    def peak(batch: int) -> int:
        return 1_000_000 + 1000 * batch + 20 * batch * batch

    candidates = Candidates.between(1, 1000)
    state = state_for(lambda b: Trial(b, "ok", peak(b), 0.01), candidates)
    sizes = [2, 4, 50, 300, 340, 400]
    state.known = {candidates.index_at_most(b): Trial(b, "ok", peak(b), 0.01) for b in sizes}
    state.low = candidates.index_at_most(400)
    model = local_model(state)
    assert model is not None and model.fitted_on == (340, 400)
    slopes = [(peak(400) - peak(b)) / (400 - b) for b in sizes[:-1]]
    assert model.bytes_per_sample == pytest.approx(max(slopes))


@pytest.mark.parametrize("held", [False, True])
@pytest.mark.parametrize("fixed", [0, 50_000_000])
def test_following_the_line_alone_finds_the_truth(held: bool, fixed: int) -> None:
    candidates, budget = Candidates.between(1, 4096), 200_000_000
    for per_sample in (37_000, 123_457, 1_000_001):
        run = up_to((budget - fixed) // per_sample, per_sample, fixed)
        state = state_for(run, candidates, budget)
        assert open_search(state, seed=None)
        state.held = held
        while state.stop_reason() is None:
            low, high = state.low, state.high
            assert follow_line(state)
            tried = candidates.index_at_most(state.trials[-1].batch_size)
            assert low < tried and (high is None or tried < high)  # inside the bracket
        assert state.low == truth_index((budget - fixed) // per_sample, candidates)
        assert len(state.trials) <= 2 * math.ceil(math.log2(candidates.count)) + 2


def test_a_forecast_only_search_stops_where_the_line_would_only_confirm() -> None:
    candidates = Candidates.between(1, 4096)
    state = state_for(up_to(10**9, 37_000, 1_000_000), candidates, 100_000_000)
    state.forecast_only = True
    assert open_search(state, seed=None)
    assert follow_line(state)  # the line's answer
    ran = len(state.trials)
    assert not follow_line(state) and len(state.trials) == ran  # its neighbour would only confirm
    assert state.trials[-1].batch_size == (100_000_000 - 1_000_000) // 37_000

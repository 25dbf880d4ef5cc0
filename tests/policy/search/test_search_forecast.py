"""The search's strategies around a forecast (its answer, the descent, asking again), each
against brute force."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import replace

import pytest

from batchfit.policy.search.search_forecast import descend, forecast_boundary, revise_forecast, try_forecast
from batchfit.policy.search.search_state import DEFAULT_TUNING, Candidates, SearchState
from batchfit.policy.search.trial import Trial


def up_to(truth: int) -> Callable[[int], Trial]:
    """Trials on a device where batches up to ``truth`` fit."""

    def run(batch: int) -> Trial:
        if batch > truth:
            return Trial(batch, "oom", 0, None, "out of memory")
        return Trial(batch, "ok", 1000 * batch, 0.01)

    return run


class Threshold:
    """A forecast that fits batches up to ``answer`` (None: it cannot say); its evidence is
    ``version``, and it counts what it is asked."""

    def __init__(self, answer: int | None, version: int = 0) -> None:
        self.answer, self.version, self.asked = answer, version, 0

    def fits(self, batch_size: int) -> bool | None:
        self.asked += 1
        return None if self.answer is None else batch_size <= self.answer

    def evidence(self) -> int:
        return self.version


def state_for(truth: int, candidates: Candidates, low: int, high: int | None = None) -> SearchState:
    state = SearchState(up_to(truth), candidates, 10**12, DEFAULT_TUNING)
    state.low, state.high = low, high
    return state


@pytest.mark.parametrize("multiple_of", [None, 4])
@pytest.mark.parametrize("high", [None, 30, 100])
def test_the_forecast_s_boundary_is_the_largest_candidate_it_fits(
    high: int | None, multiple_of: int | None
) -> None:
    candidates = Candidates.between(1, 200, multiple_of)
    for low in (0, 3, 17):
        for answer in range(candidates.batch(low), 220):
            top = candidates.count if high is None else high
            truth = max(i for i in range(low, top) if candidates.batch(i) <= answer)  # brute force
            assert forecast_boundary(Threshold(answer), candidates, low, high) == truth
    assert forecast_boundary(Threshold(None), candidates, 0, high) is None


def test_a_right_forecast_closes_the_bracket_with_its_answer_and_the_next() -> None:
    candidates = Candidates.between(1, 512)
    state = state_for(137, candidates, low=3)
    state.predicted = candidates.index_at_most(137)
    assert try_forecast(state) and try_forecast(state)
    assert [t.batch_size for t in state.trials] == [137, 138]
    assert state.stop_reason() == "boundary" and state.low == candidates.index_at_most(137)
    state.predicted = None
    assert not try_forecast(state) and len(state.trials) == 2  # no answer: nothing runs


def test_a_low_forecast_is_done_once_the_candidate_after_it_fits() -> None:
    candidates = Candidates.between(1, 512)
    state = state_for(300, candidates, low=3)
    state.predicted = candidates.index_at_most(200)
    assert try_forecast(state) and try_forecast(state)
    assert [t.batch_size for t in state.trials] == [200, 201]
    assert state.predicted is None and state.low_forecast and state.high is None


@pytest.mark.parametrize("multiple_of", [None, 8])
def test_a_failed_answer_starts_the_descent_a_share_of_it_below(multiple_of: int | None) -> None:
    candidates = Candidates.between(1, 8192, multiple_of)
    state = state_for(3000, candidates, low=3)
    answer = candidates.index_at_most(3495)
    state.predicted = answer
    assert try_forecast(state)
    batch = candidates.batch(answer)
    tuning, step = state.tuning, candidates.step
    assert state.predicted is None and state.high == answer
    assert state.descent == max(1, round(batch * tuning.first_descent / step))
    assert candidates.batch(state.floor) <= batch * (1 - tuning.descent) < candidates.batch(state.floor + 1)


@pytest.mark.parametrize("answer", [125, 168, 600, 3495])
def test_the_descent_finds_the_truth_within_its_reach_and_leaves_the_rest_to_the_line(answer: int) -> None:
    candidates = Candidates.between(1, 8192)
    for truth in range(answer // 2, answer):
        state = state_for(truth, candidates, low=candidates.index_at_most(4))
        state.predicted = candidates.index_at_most(answer)
        assert try_forecast(state)  # the answer fails
        floor = state.floor
        while state.stop_reason() is None and descend(state):
            pass
        tried = [t.batch_size for t in state.trials[1:]]
        assert all(batch >= candidates.batch(floor) for batch in tried)  # never below the floor
        # The gallop: a share of the answer below it, then doubling steps; the last step may
        # instead land on the floor or the middle of what is left.
        gallop_end = next((i + 1 for i, t in enumerate(state.trials[1:]) if t.fits), len(tried))
        galloped = [answer, *tried[:gallop_end]]  # down to the first size that fits
        steps = [above - below for above, below in itertools.pairwise(galloped)]
        assert not steps or steps[0] == max(1, round(answer * state.tuning.first_descent))
        assert all(later == 2 * earlier for earlier, later in itertools.pairwise(steps[:-1]))
        if len(steps) > 1 and steps[-1] != 2 * steps[-2]:
            middle = (candidates.index_at_most(4) + candidates.index_at_most(galloped[-2]) + 1) // 2
            assert galloped[-1] in (candidates.batch(floor), candidates.batch(middle))
        if state.descent != 0:  # a size fitted: bisected to the boundary, by force
            assert state.stop_reason() == "boundary" and state.low == candidates.index_at_most(truth)
            assert len(tried) <= 2 * answer.bit_length()
        else:  # every trial failed and the line decides: the truth is below the floor, or the
            # floor is so near the last failure that the line's next trial is as good
            assert state.low == candidates.index_at_most(4) and all(batch > truth for batch in tried)
            assert truth < candidates.batch(floor) or state.high - floor <= state.tuning.floor_gap
        if truth >= candidates.batch(floor) + state.tuning.floor_gap:  # well within reach
            assert state.stop_reason() == "boundary"


@pytest.mark.parametrize("revisions", [0, DEFAULT_TUNING.revisions, 3])
def test_a_refuted_forecast_is_asked_again_only_on_new_evidence_and_at_most_revisions_times(
    revisions: int,
) -> None:
    candidates = Candidates.between(1, 512)
    state = state_for(150, candidates, low=candidates.index_at_most(140), high=candidates.index_at_most(160))
    state.tuning = replace(DEFAULT_TUNING, revisions=revisions)  # as the search is handed it
    forecast = Threshold(150)
    state.forecast, state.evidence = forecast, 0
    revise_forecast(state)  # not refuted
    assert forecast.asked == 0 and state.predicted is None
    state.descent = -1  # a size below its failed answer fitted
    revise_forecast(state)  # refuted, but its evidence is the same
    assert forecast.asked == 0 and state.predicted is None
    for revision in range(1, state.tuning.revisions + 2):
        forecast.version = revision
        state.predicted = None
        revise_forecast(state)
        asked_again = revision <= state.tuning.revisions
        assert state.revisions == min(revision, state.tuning.revisions)
        assert state.predicted == (candidates.index_at_most(150) if asked_again else None)

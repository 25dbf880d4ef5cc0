"""The search's strategies around a ``FitForecast``: its answer tried, the descent below an answer
that failed, and the forecast asked again once a trial near the boundary has changed its evidence."""

from __future__ import annotations

from batchfit.policy.search.search_state import Candidates, FitForecast, SearchState


def ask_forecast(state: SearchState) -> None:
    """Ask the forecast for its answer (``predicted``) once the opening has run."""
    if state.forecast is not None and not state.forecast_only:
        state.evidence = state.forecast.evidence()
        state.predicted = forecast_boundary(state.forecast, state.candidates, state.low, _top(state))


def revise_forecast(state: SearchState) -> None:
    """Ask the forecast again where it was refuted (below its failed answer a size fitted, or the
    candidate after its answer did) and its evidence has changed since (that trial's allocator
    requests, a batch near the boundary), up to ``tuning.revisions`` times: its new answer is worth a
    trial before the descent's bisection or the line's."""
    refuted = state.descent < 0 or state.low_forecast
    forecast = state.forecast
    if not refuted or state.predicted is not None or forecast is None:
        return
    if state.revisions >= state.tuning.revisions:
        return
    now = forecast.evidence()
    if now != state.evidence:
        state.evidence, state.revisions = now, state.revisions + 1
        state.predicted = forecast_boundary(forecast, state.candidates, state.low, _top(state))


def try_forecast(state: SearchState) -> bool:
    """Run the forecast's answer (``predicted``), or, once that fitted, the candidate after it.
    Returns False, running nothing, where there is no answer to try.

    Where the one after fitted too, the answer was low (``low_forecast``) and the forecast is
    done; where the answer itself failed, the boundary is close below it: the descent starts
    ``tuning.first_descent`` of the batch below it (at least one candidate), down to
    ``tuning.descent`` below it.
    """
    predicted, candidates = state.predicted, state.candidates
    if predicted is None:
        return False
    index = max(predicted, state.low + 1)
    if state.probe(index).fits:
        state.low = index
        if index > predicted:  # it fitted past the forecast: the forecast was low
            state.predicted, state.low_forecast = None, True
            if state.refuted is not None:  # refuted above and below: bisect, asking it no more
                state.revisions, state.descent = state.tuning.revisions, -1
        return True
    state.high = index
    if index <= predicted:  # the forecast's answer failed: the boundary is close below
        batch = candidates.batch(index)
        state.predicted = None
        if state.seeded and state.revisions < state.tuning.revisions:
            state.predicted = below_refuted(state, index)
        if state.predicted is not None:  # the forecast's band below the refuted one: its top next
            state.revisions += 1
            return True
        state.descent = max(1, round(batch * state.tuning.first_descent / candidates.step))
        state.floor = candidates.index_at_most(batch * (1 - state.tuning.descent))
    return True


def descend(state: SearchState) -> bool:
    """Below a forecast's answer that failed, run one trial: gallop down from the last failure,
    doubling the step, then bisect once a size fits. Returns False, running nothing, where the
    descent is over or not begun (``tuning.descent`` 0): the line decides.

    A forecast overshoots by a small share of the batch, while the line, which a caching
    allocator's overhead holds back, restarts further below and creeps up; the gallop finds the
    first size that fits near the failure. Past ``tuning.descent`` below the forecast's answer (a forecast
    far off) the line decides; the doubling stops at that floor rather than past it, trying the
    floor itself where it lies more than ``tuning.floor_gap`` candidates below the last failure.
    """
    low, high, descent = state.low, state.high, state.descent
    if not descent or high is None:
        return False
    bisecting = descent < 0  # a size has fitted since: the boundary is bracketed
    index = (low + high) // 2 if bisecting else max(high - descent, (low + high + 1) // 2)
    if not bisecting and index < state.floor < high - state.tuning.floor_gap:
        index = max(state.floor, (low + high + 1) // 2)  # the gallop's last step: the floor itself
    if not bisecting and index < state.floor:
        state.descent = 0  # a forecast far off: the line decides
        return False
    if state.probe(index).fits:
        state.low, state.descent = index, -1
    else:
        state.high, state.descent = index, descent if bisecting else 2 * descent
    return True


def forecast_boundary(
    forecast: FitForecast, candidates: Candidates, low: int, high: int | None
) -> int | None:
    """The largest index in [low, high) that ``forecast`` fits, galloping up from ``low`` (doubling
    the batch) and bisecting; None where it cannot say."""
    top = candidates.count if high is None else high  # the first index not to ask about
    fitting, failing = low, top
    while failing - fitting > 1:
        if failing == top:  # no forecast failure yet: double the batch
            index = min(max(candidates.index_at_most(2 * candidates.batch(fitting)), fitting + 1), top - 1)
        else:
            index = (fitting + failing) // 2
        fits = forecast.fits(candidates.batch(index))
        if fits is None:
            return None
        fitting, failing = (index, failing) if fits else (fitting, index)
    return fitting


def below_refuted(state: SearchState, index: int) -> int | None:
    """Where the forecast's answer at ``index`` failed and the forecast puts a band of failures
    just below it, the top of the band it fits below those (the band it placed the answer in is
    refuted, not the one below); None where it fits every size down to ``tuning.descent`` below the
    answer (or to ``low``), there the forecast is off by a shift and the descent finds it, or
    where it cannot say."""
    forecast, candidates = state.forecast, state.candidates
    if forecast is None:
        return None
    floor = max(state.low + 1, candidates.index_at_most(candidates.batch(index) * (1 - state.tuning.descent)))
    below, verdict = index - 1, None
    for wanted in (True, False):  # down the refuted band, then down the failures below it
        while below >= floor and (verdict := forecast.fits(candidates.batch(below))) is wanted:
            below -= 1
        if below < floor or verdict is None:
            return None
        refuted = below + 1  # the refuted band's lowest index: the forecast is not asked above it
    state.refuted = refuted
    return below


def _top(state: SearchState) -> int | None:
    """The first index the forecast is not asked about: the smallest known failure, or the lowest of
    a band of its that a real trial refuted (``below_refuted``), where that is lower."""
    if state.refuted is None or (state.high is not None and state.high <= state.refuted):
        return state.high
    return state.refuted

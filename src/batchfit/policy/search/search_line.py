"""The search's own strategies: the opening trials, the memory line (fixed bytes + bytes per
sample) through the trials, and the safe step (bisection, a gallop) where the line is not trusted."""

from __future__ import annotations

from batchfit.policy.search.search_forecast import below_refuted, forecast_boundary
from batchfit.policy.search.search_state import Candidates, SearchState
from batchfit.policy.search.trial import MemoryModel, Trial


def open_search(state: SearchState, seed: int | None) -> bool:
    """Run the first trials: the ``seed`` (a predicted answer), then, where it failed or there is
    none, about 2x and 4x the smallest candidate below it. Sets ``low`` and ``high``; False where
    not even the smallest candidate fits.

    A seed that fails refutes the prior's predicted trials: they leave ``known``, and the real
    trials alone place the line from here.
    """
    candidates = state.candidates
    if seed is not None and candidates.first <= seed:
        index = min(candidates.index_at_most(seed), candidates.count - 1)
        if state.probe(index).fits:
            state.low = index
            return True
        state.high = index
        state.known = dict(state.at)
        if _replayed_below(state, index):
            return True
    count = candidates.count if state.high is None else state.high
    below = Candidates(candidates.first, candidates.step, count)
    if below.count == 0:  # the seed was the smallest candidate
        return False
    fitting, failing = _opening(state, below)
    state.low = -1 if fitting is None else fitting
    state.high = state.high if failing is None else failing
    return fitting is not None


def _replayed_below(state: SearchState, failed: int) -> bool:
    """After the seed (a saved prediction's answer, at index ``failed``) failed, where a forecast
    replays the prediction's records: its answer below the seed (the top of the band below the
    refuted one, or its largest fit below the seed), run in place of the opening, whose small trials
    the records already hold. True where it fitted (``low`` set); where it failed, ``high`` is it."""
    forecast = state.forecast
    if forecast is None or not state.seeded or state.forecast_only or failed == 0:
        return False
    index = below_refuted(state, failed)
    if index is None:
        index = forecast_boundary(forecast, state.candidates, -1, failed)
    if index is None or index < 0:
        return False
    if state.probe(index).fits:
        state.low = index
        return True
    state.high = index
    return False


def _opening(state: SearchState, below: Candidates) -> tuple[int | None, int | None]:
    """The first probes among ``below``: about 2x and 4x the smallest candidate, to fit the first line.

    The smallest batch is often off the line (size-1 code paths, broadcasting; BatchNorm refuses
    a single sample in training), so it is run only if the first probe fails. Returns the largest
    index known to fit (None if not even the smallest does) and the smallest known to fail.
    """
    first = min(max(below.index_at_most(2 * below.first), 0), below.count - 1)
    if not state.probe(first).fits:
        if first == 0 or not state.probe(0).fits:
            return None, first
        return 0, first
    second = min(max(below.index_at_most(4 * below.first), first + 1), below.count - 1)
    if second == first:
        return first, None
    return (second, None) if state.probe(second).fits else (first, second)


def follow_line(state: SearchState) -> bool:
    """Run one trial where the line through the trials puts the boundary (held below it by the
    margin behind a caching allocator), or a safe step where the line is not trusted. Returns
    False, running nothing, where a ``forecast_only`` search would only confirm the line's answer.
    """
    state.model = local_model(state) or state.model
    margin = _margin(state) if state.held else 0.0
    index, guided = next_index(state, margin)
    if state.forecast_only and guided and index == state.low + 1:
        return False  # the line puts the boundary at low: real trials will confirm it
    trial = state.probe(index)
    _learn(state, index, guided, margin, trial)
    return True


def _learn(state: SearchState, index: int, guided: bool, margin: float, trial: Trial) -> None:
    """Update the bracket and the line's trust from the trial at ``index``.

    A line that underestimates twice running is not trusted next (that is a property of the curve
    near the boundary, so the distrust stays). One that overshoots blind (out of memory where it
    predicted room) behind a caching allocator is held below, by a margin that doubles while held
    answers still fail: a line of allocated bytes misses what the allocator needs beside them
    (fragmentation, workspaces). On an exact device the next line, through the trials that
    fitted, is the correction, as holding it below only creeps up. A held answer that fails is a
    step down from the top, bounded by the doubling, so it does not count as a stalled interval.
    """
    fits = trial.fits
    if guided and fits and index == state.low + 1:
        state.checks_fitted += 1
    aim = int(state.budget_bytes * (1 - margin))
    overshot = guided and _overshoots(state.model, aim, state.candidates, index, trial)
    state.held_failures = state.held_failures + 1 if state.held and overshot else 0
    state.held_fitted = state.held_fitted or (state.held and guided and fits)
    state.held = state.held or (overshot and state.known[state.low].reserved_peak_bytes is not None)
    state.distrust = state.checks_fitted >= 2 or (overshot and margin >= state.tuning.max_margin)
    if fits:
        state.stride = 2 * state.stride if not guided and state.distrust else state.stride
        state.low = index
    else:
        state.high = index
    if state.high is not None and not (state.held and overshot):
        state.widths.append(state.high - state.low)


def local_model(state: SearchState) -> MemoryModel | None:
    """A line through the largest fitting trial and a second one with a whole peak.

    The second is the failed trial just above when it ran to the end (the bracket), else, among
    the fitting trials at most ``tuning.near`` of its size or ``tuning.near_rise`` of its peak below it (far
    enough that rounding in the peaks does not swamp the slope), the one that gives the steepest
    line. Where memory is mostly fixed at small batches (a plateau, then activations), or where the
    slope grows with the batch, a line from further down overshoots the boundary, and a trial that
    runs out of memory there teaches nothing; too steep a line undershoots, and a trial that fits
    brings a whole peak.
    """
    known, high = state.known, state.high
    upper = known.get(high) if high is not None else None
    if upper is not None and upper.outcome == "over_budget":
        return MemoryModel.through(known[state.low], upper)
    best = known[state.low]
    below = [t for t in known.values() if t.fits and t.batch_size < best.batch_size]
    if not below:
        return None
    rise = best.peak_bytes * state.tuning.near_rise
    near = state.tuning.near
    far = [
        t for t in below if t.batch_size <= best.batch_size * near or best.peak_bytes - t.peak_bytes >= rise
    ]
    if not far:
        return MemoryModel.through(min(below, key=lambda t: t.batch_size), best)
    lines = [MemoryModel.through(t, best) for t in far]
    return max(lines, key=lambda m: m.bytes_per_sample)


def next_index(state: SearchState, margin: float) -> tuple[int, bool]:
    """The next index to try in (low, high), and whether the line chose it.

    The line's answer is for the budget less ``margin``. A line that puts the boundary at ``low``
    is checked by trying ``low + 1``: cheap, and decisive when it fails. A guess further in is
    taken unless the line was just refuted or the interval has stopped halving (its width, over
    two trials, more than half what it was); then the step is ``safe_step``'s.
    """
    low, high, widths = state.low, state.high, state.widths
    model = state.model
    predicted = None if model is None else model.max_batch_size(int(state.budget_bytes * (1 - margin)))
    if predicted is not None and not state.distrust:
        index = state.candidates.index_at_most(predicted)
        if index <= low:
            return low + 1, True
        stalled = len(widths) >= 3 and widths[-1] > widths[-3] / 2
        if high is None or (index < high and not stalled):
            return min(index, _top(state)), True
    return safe_step(state), False


def safe_step(state: SearchState) -> int:
    """The next index where the line is not followed: the middle of (low, high); while no failure
    is known, twice the batch at ``low`` (a gallop), or, once the line is distrusted (near a
    boundary it misjudges), growing strides above ``low``."""
    low, high = state.low, state.high
    if high is not None:
        return (low + high) // 2
    if state.distrust:
        return min(low + state.stride, _top(state))
    candidates = state.candidates
    return min(max(candidates.index_at_most(2 * candidates.batch(low)), low + 1), _top(state))


def _top(state: SearchState) -> int:
    """The largest index still open: below ``high``, or the last candidate."""
    return state.candidates.count - 1 if state.high is None else state.high - 1


def _margin(state: SearchState) -> float:
    """How far below the budget a held line aims.

    What the caching allocator held beside the allocated bytes in the largest trial that fitted
    (1 - allocated / reserved, at most ``tuning.max_overhead``: far below the cap the cache also holds
    what it merely kept), and ``tuning.first_margin`` at least until a held answer has fitted; doubled for
    each held answer that failed since the last that fitted.
    """
    tuning, largest_fitting = state.tuning, state.known[state.low]
    reserved, allocated = largest_fitting.reserved_peak_bytes, largest_fitting.peak_bytes
    overhead = (
        min(tuning.max_overhead, 1 - allocated / reserved) if reserved and reserved > allocated else 0.0
    )
    if not state.held_fitted or state.held_failures:
        overhead = max(tuning.first_margin, overhead)
    return float(min(tuning.max_margin, overhead * 2**state.held_failures))


def _overshoots(
    model: MemoryModel | None, budget_bytes: int, candidates: Candidates, index: int, trial: Trial
) -> bool:
    """True when the line predicted ``index`` to fit and it failed without a whole peak to learn from."""
    if model is None or trial.outcome != "oom":
        return False
    predicted = model.max_batch_size(budget_bytes)
    return predicted is not None and candidates.index_at_most(predicted) >= index

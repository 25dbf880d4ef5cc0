"""The search arithmetic, free of torch: the largest batch a ``run(batch) -> Trial`` oracle accepts.

It fits a memory model (fixed bytes + bytes per sample) to the trials it has, jumps to the
predicted boundary and confirms it: the answer was run and fitted, and the next larger candidate
was run and failed (or the upper bound was reached). Model-guided steps fall back to bisection
(galloping upwards while no failure is known) whenever they stop halving the interval, so the
trial count is never worse than a binary search's by more than a couple.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence

from batchfit.policy.search_state import Candidates, Forecast, SearchOutcome, StopReason
from batchfit.policy.trial import MemoryModel, Trial

__all__ = ["Candidates", "Forecast", "SearchOutcome", "StopReason", "confirm", "search", "search_and_confirm"]

#: Behind a caching allocator (trials that report reserved bytes), the model's answers are held at
#: least this share of the budget below what it predicts (twice that after a held answer fails, and
#: so on, up to ``MAX_MARGIN``, past which the search bisects). On an exact device they are not: a
#: line that overshoots there is wrong in its slope, not short of an allocator's overhead.
FIRST_MARGIN = 0.02
MAX_MARGIN = 0.5
#: The most of a trial's reserved memory read as the allocator's need beside the allocated bytes.
MAX_OVERHEAD = 0.1
#: How close below the largest fitting trial a second may be to fit the line through them.
NEAR = 0.875
#: Or how far below its peak, as a share of that peak.
NEAR_RISE = 1 / 32
#: How far below a forecast's answer that failed the search gallops down before the line decides.
DESCENT = 1 / 8
#: The first step down from a forecast's answer that failed, as a share of it (at least one
#: candidate). The overshoots are shares of the batch (0.4-5% on the H100 and the H200, at 124-243
#: samples), and what ends the gallop is the first size that fits: its recorded requests are near
#: the boundary, and the forecast asked again on them placed the answer live (160 from 153). From
#: 1 below, the cnn 8 over and the transformer 4 over took 8 trials each (Lightning 15); from a
#: 32nd (5 below 168) they take 7 and 6, one over 5 where it took 4.
FIRST_DESCENT = 1 / 32
#: Where the gallop's next step would pass DESCENT below the forecast's answer, it tries that floor
#: itself before the line decides, if the floor lies more than this many candidates below the last
#: failure (nearer, as at small batches, the line's next trial is as good).
FLOOR_GAP = 16
#: How many times a forecast that was refuted is asked again, on new evidence (a trial near its
#: answer that fitted and was recorded), before the bisection or the line alone goes on.
REVISIONS = 2


def search(
    run: Callable[[int], Trial],
    candidates: Candidates,
    budget_bytes: int,
    *,
    prior: Sequence[Trial] = (),
    seed: int | None = None,
    forecast_only: bool = False,
    longer: Callable[[int], Trial] | None = None,
    forecast: Forecast | None = None,
) -> SearchOutcome:
    """Find the largest candidate batch that ``run`` reports as fitting ``budget_bytes``.

    ``prior`` trials (predicted, not run: a fake-tensor trace) inform the memory model but prove
    nothing, and leave it once a real trial at the ``seed`` (a predicted answer, where the real
    trials start) refutes them. With ``forecast_only`` (``run`` is a predictor) the search stops
    where it would only confirm the model's answer.
    With ``longer`` (the confirming trial: more steps), the ``seed`` and every trial after the
    opening (or after a failure within it) run it: from then on each trial aims at the answer, so
    its verdict is the confirmation's, and an answer found there needs no trial of its own
    (``confirmed``). A trial that fails does so at the step it runs out of memory, so the longer
    trial costs more only where it fits. A ``forecast``, asked once the opening has run, places
    the next trials at the boundary it predicts and the candidate after it, until a real trial
    refutes it. Where its answer failed, the search gallops down from there (1, 2, 4, ... below the
    last failure, from ``FIRST_DESCENT`` of the batch at large ones) and bisects once a size fits,
    for up to ``DESCENT`` below that answer; where the one after fitted, or past that, the line
    decides. Once a size below its failed answer has fitted, or the one after its answer has (it
    was low), the forecast is asked again where its evidence changed (the replay's records now hold
    that trial, near the boundary), up to ``REVISIONS`` times: its new answer and the candidate
    after it are tried before the bisection or the line goes on.
    """
    trials: list[Trial] = []
    at: dict[int, Trial] = {}
    known = {candidates.index_at_most(t.batch_size): t for t in prior if t.outcome != "oom"}
    ran_longer: set[int] = set()

    def probe(index: int) -> Trial:
        trial_of = run
        if longer is not None and (aiming or high is not None):  # this trial may be the answer
            trial_of = longer
            ran_longer.add(index)
        trial = trial_of(candidates.batch(index))
        trials.append(trial)
        at[index] = known[index] = trial
        return trial

    opened, high = None, None
    aiming = seed is not None  # a forecast's answer, and every trial past the opening, aims at the answer
    if seed is not None and candidates.first <= seed:
        index = min(candidates.index_at_most(seed), candidates.count - 1)
        if probe(index).fits:
            opened = index
        else:  # the traces' answer refuted: their peaks (a shorter trial's, under confirm_steps)
            high = index  # leave the line, which the real trials alone place from here
            known = dict(at)
    if opened is None:
        below = candidates if high is None else Candidates(candidates.first, candidates.step, high)
        opened, high_below = _opening(below, probe) if below.count > 0 else (None, None)
        high = high if high_below is None else high_below
    if opened is None:
        return SearchOutcome(None, tuple(trials), None, "min_batch_size_failed")
    low = opened  # the largest index known to fit; high: the smallest known to fail
    aiming = True
    widths: list[int] = []
    model: MemoryModel | None = None
    distrust = False  # the model's last guess was refuted: take a safe step (bisect or gallop)
    confirmed = 0  # "low + 1" checks that fitted: the model underestimates here
    stride = 2  # the step of an exponential search upwards from low, once the model is distrusted
    # The model's answers are held below what it predicts once it has overshot, and from the start
    # behind a caching allocator (the trials report reserved bytes): it needs more than the
    # allocated bytes the model counts (rounding, fragmentation), so the line is an upper bound.
    held = known[low].reserved_peak_bytes is not None
    held_failures = 0  # held answers that ran out of memory since the last that fitted
    held_fitted = False  # a held answer has fitted: the margin is measured near the boundary
    predicted = None
    descent = 0  # after the forecast's answer failed: how far below the last failure to try next (-1: bisect)
    floor = 0  # the lowest index that descent tries
    evidence: Hashable = None  # what the forecast's last answer rested on
    revisions = 0
    low_forecast = False  # the candidate after the forecast's answer fitted: its answer was low
    if forecast is not None and not forecast_only:
        evidence = forecast.evidence()
        predicted = _forecast_boundary(forecast, candidates, low, high)
    while True:
        if high is None and low == candidates.count - 1:
            reason: StopReason = "max_batch_size"
            break
        if high is not None and high == low + 1:
            reason = "boundary"
            break
        refuted = descent < 0 or low_forecast  # a size below its failed answer fitted, or it was low
        if refuted and predicted is None and forecast is not None and revisions < REVISIONS:
            # Below the forecast's failed answer a size fitted, or above its answer one did: where
            # the forecast now rests on other evidence (that trial's allocator requests, a batch
            # near the boundary), its answer is worth a trial before the bisection's or the line's.
            now = forecast.evidence()
            if now != evidence:
                evidence, revisions = now, revisions + 1
                predicted = _forecast_boundary(forecast, candidates, low, high)
        if predicted is not None:  # the forecast's answer, then the candidate after it
            index = max(predicted, low + 1)
            if probe(index).fits:
                low = index
                if index > predicted:  # it fitted past the forecast: the forecast was low
                    predicted, low_forecast = None, True
            else:
                high = index
                if index <= predicted:  # the forecast's answer failed: the boundary is close below
                    predicted = None
                    descent = max(1, round(candidates.batch(index) * FIRST_DESCENT / candidates.step))
                    floor = candidates.index_at_most(candidates.batch(index) * (1 - DESCENT))
            continue
        if descent and high is not None:
            # The forecasts that overshot on the H100 did so by 0 to 5%, and the line, which a
            # caching allocator's overhead holds back, restarted 10% below and crept up over 8-9
            # trials: gallop down from the failure, doubling the step (from FIRST_DESCENT of it),
            # then bisect once a size fits. Past DESCENT below the forecast's answer (a forecast
            # far off), the line decides; the doubling stops at that floor rather than past it
            # (at 3,495 samples, 1, 2, ... 256 below passed it where 7.7% below fitted).
            bisecting = descent < 0  # a size has fitted since: the boundary is bracketed
            index = (low + high) // 2 if bisecting else max(high - descent, (low + high + 1) // 2)
            if not bisecting and index < floor < high - FLOOR_GAP:
                index = max(floor, (low + high + 1) // 2)  # the gallop's last step: the floor itself
            if bisecting or index >= floor:
                if probe(index).fits:
                    low, descent = index, -1
                else:
                    high, descent = index, descent if bisecting else 2 * descent
                continue
            descent = 0  # a forecast far off: the line decides
        model = _local_model(known, low, high) or model
        stalled = len(widths) >= 3 and widths[-1] > widths[-3] / 2
        margin = _margin(known[low], held_failures, held_fitted) if held else 0.0
        index, guided = _next_index(
            candidates, budget_bytes, model, low, high, distrust, stalled, stride, margin
        )
        if forecast_only and guided and index == low + 1:
            reason = "predicted"  # the model puts the boundary at low: real trials will confirm it
            break
        trial = probe(index)
        fits = trial.fits
        # A model that underestimates twice running is not trusted next; one that overshoots blind
        # (out of memory where it predicted room) behind a caching allocator is held below, by a
        # margin that doubles while held answers still fail: a model of allocated bytes misses what
        # the allocator needs beside them (fragmentation, workspaces). On an exact device the
        # next line, through the trials that fitted, is the correction (holding it below only
        # crept up: the untraceable mlp under 1.5 MB took 13 trials that way, now 9). A held
        # answer that fails is a step down from the top, bounded by the doubling, so it does not
        # count as a stalled interval.
        # (Underestimating is a property of the curve near the boundary, so that distrust stays.)
        confirmed = confirmed + 1 if guided and fits and index == low + 1 else confirmed
        overshot = guided and _overshoots(model, int(budget_bytes * (1 - margin)), candidates, index, trial)
        held_failures = held_failures + 1 if held and overshot else 0
        held_fitted = held_fitted or (held and guided and fits)
        held = held or (overshot and known[low].reserved_peak_bytes is not None)
        distrust = confirmed >= 2 or (overshot and margin >= MAX_MARGIN)
        if fits:
            stride = 2 * stride if not guided and distrust else stride
            low = index
        else:
            high = index
        if high is not None and not (held and overshot):
            widths.append(high - low)
    return SearchOutcome(candidates.batch(low), tuple(trials), model, reason, low in ran_longer)


def _opening(candidates: Candidates, probe: Callable[[int], Trial]) -> tuple[int | None, int | None]:
    """The first probes: about 2x and 4x the smallest candidate, to fit the first line.

    The smallest batch is often off the line (size-1 code paths, broadcasting; BatchNorm refuses
    a single sample in training), so it is run only if the first probe fails. Returns the largest
    index known to fit (None if not even the smallest does) and the smallest known to fail.
    """
    first = min(max(candidates.index_at_most(2 * candidates.first), 0), candidates.count - 1)
    if not probe(first).fits:
        if first == 0 or not probe(0).fits:
            return None, first
        return 0, first
    second = min(max(candidates.index_at_most(4 * candidates.first), first + 1), candidates.count - 1)
    if second == first:
        return first, None
    return (second, None) if probe(second).fits else (first, second)


def _forecast_boundary(forecast: Forecast, candidates: Candidates, low: int, high: int | None) -> int | None:
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


def _local_model(at: dict[int, Trial], low: int, high: int | None) -> MemoryModel | None:
    """A line through the largest fitting trial and a second one with a whole peak.

    The second is the failed trial just above when it ran to the end (the bracket), else, among
    the fitting trials at most ``NEAR`` of its size or ``NEAR_RISE`` of its peak below it (far
    enough that rounding in the peaks does not swamp the slope), the one that gives the steepest
    line. Where memory is mostly fixed at small batches (a plateau, then activations), or where the
    slope grows with the batch, a line from further down overshoots the boundary, and a trial that
    runs out of memory there teaches nothing; too steep a line undershoots, and a trial that fits
    brings a whole peak.
    """
    upper = at.get(high) if high is not None else None
    if upper is not None and upper.outcome == "over_budget":
        return MemoryModel.through(at[low], upper)
    best = at[low]
    below = [t for t in at.values() if t.fits and t.batch_size < best.batch_size]
    if not below:
        return None
    rise = best.peak_bytes * NEAR_RISE
    far = [
        t for t in below if t.batch_size <= best.batch_size * NEAR or best.peak_bytes - t.peak_bytes >= rise
    ]
    if not far:
        return MemoryModel.through(min(below, key=lambda t: t.batch_size), best)
    lines = [MemoryModel.through(t, best) for t in far]
    return max(lines, key=lambda m: m.bytes_per_sample)


def _next_index(
    candidates: Candidates,
    budget_bytes: int,
    model: MemoryModel | None,
    low: int,
    high: int | None,
    distrust: bool,
    stalled: bool,
    stride: int,
    margin: float = 0.0,
) -> tuple[int, bool]:
    """The next index to try in (low, high), and whether the memory model chose it.

    The model's answer is for the budget less ``margin``. A model that puts the boundary at
    ``low`` is checked by trying ``low + 1``: cheap, and decisive when it fails. A guess further in
    is taken unless the model was just refuted or the interval has stopped halving; then the step
    is a bisection (while no failure is known: a gallop from the start, or growing strides once
    the model is distrusted).
    """
    upper = candidates.count - 1 if high is None else high - 1
    predicted = None if model is None else model.max_batch_size(int(budget_bytes * (1 - margin)))
    if predicted is not None and not distrust:
        index = candidates.index_at_most(predicted)
        if index <= low:
            return low + 1, True
        if high is None or (index < high and not stalled):
            return min(index, upper), True
    if high is not None:
        return (low + high) // 2, False
    if distrust:  # near a boundary the model misjudges: search upwards in growing strides
        return min(low + stride, upper), False
    return min(max(candidates.index_at_most(2 * candidates.batch(low)), low + 1), upper), False


def _margin(largest_fitting: Trial, failures: int, fitted: bool) -> float:
    """How far below the budget a held model aims.

    What the caching allocator held beside the allocated bytes in the largest trial that fitted
    (1 - allocated / reserved, at most ``MAX_OVERHEAD``: far below the cap the cache also holds
    what it merely kept), and ``FIRST_MARGIN`` at least until a held answer has fitted; doubled for
    each held answer that failed since the last that fitted.
    """
    reserved, allocated = largest_fitting.reserved_peak_bytes, largest_fitting.peak_bytes
    overhead = min(MAX_OVERHEAD, 1 - allocated / reserved) if reserved and reserved > allocated else 0.0
    if not fitted or failures:
        overhead = max(FIRST_MARGIN, overhead)
    return float(min(MAX_MARGIN, overhead * 2**failures))


def _overshoots(
    model: MemoryModel | None, budget_bytes: int, candidates: Candidates, index: int, trial: Trial
) -> bool:
    """True when the model predicted ``index`` to fit and it failed without a whole peak to learn from."""
    if model is None or trial.outcome != "oom":
        return False
    predicted = model.max_batch_size(budget_bytes)
    return predicted is not None and candidates.index_at_most(predicted) >= index


def search_and_confirm(
    run: Callable[[int], Trial],
    candidates: Candidates,
    budget_bytes: int,
    *,
    prior: Sequence[Trial] = (),
    seed: int | None = None,
    longer: Callable[[int], Trial] | None = None,
    exact: bool = True,
    forecast: Forecast | None = None,
) -> SearchOutcome:
    """``find``'s whole policy over oracles: ``search`` with ``run``, then the answer confirmed.

    With ``longer`` (a trial of more steps: CUDA's caching allocator fragments over the first
    steps) the search runs it past its opening (and at a ``seed``), and an answer it did not run that way is
    run again with it and, if it no longer fits, searched below with it. On a
    device that is not ``exact`` (the uncapped CPU, where glibc's heap keeps what a failed trial
    grew it to) the answer is looked at again with ``run`` after an allocator failure. The
    benchmark's replay (``bench/find_replay.py``) runs this same function on recorded trials.
    """
    outcome = search(run, candidates, budget_bytes, prior=prior, seed=seed, longer=longer, forecast=forecast)
    if longer is not None:
        return outcome if outcome.confirmed else confirm(outcome, longer, candidates, budget_bytes)
    if not exact:
        return confirm(outcome, run, candidates, budget_bytes, always=False)
    return outcome


def confirm(
    outcome: SearchOutcome,
    run: Callable[[int], Trial],
    candidates: Candidates,
    budget: int,
    *,
    always: bool = True,
) -> SearchOutcome:
    """Run the answer again with ``run``; while it no longer fits, search below it with ``run``.

    Two devices need this second look. A caching allocator (CUDA) fragments over the first steps:
    a batch whose two steps fit under the cap may fail at its fifth, so ``run`` is a longer trial
    (``always``). And glibc's heap keeps what a failed trial grew it to (under RLIMIT_AS), so a
    batch that fitted early in the search may not fit after it, which is when training starts:
    ``run`` is the search's own, needed only after a real allocator failure (``always=False``).
    The answer that failed was just over the line, so the search below gallops down from the next
    smaller candidate (strides 1, 2, 4, ...) and bisects the last stride.
    """
    trials = list(outcome.trials)
    for _ in range(3):
        if outcome.batch_size is None or (not always and all(t.outcome != "oom" for t in trials)):
            break
        again = run(outcome.batch_size)
        trials.append(again)
        if again.fits:
            break
        below = outcome.batch_size - candidates.step
        if below < candidates.first:
            outcome = SearchOutcome(None, outcome.trials, outcome.memory_model, "min_batch_size_failed")
            break
        outcome = _downwards(run, candidates, candidates.index_at_most(below), outcome.memory_model)
        trials.extend(outcome.trials)
        if always:  # the search below ran ``run``'s own trials: its answer is confirmed
            break
    confirmed = always and outcome.batch_size is not None  # the answer's last trial is ``run``'s
    return SearchOutcome(
        outcome.batch_size, tuple(trials), outcome.memory_model, outcome.stop_reason, confirmed
    )


def _downwards(
    run: Callable[[int], Trial], candidates: Candidates, top: int, model: MemoryModel | None
) -> SearchOutcome:
    """The largest candidate at most index ``top`` that ``run`` fits, where ``top + 1`` failed:
    down in doubling strides from ``top`` to the first that fits, then bisection above it."""
    trials: list[Trial] = []
    high, index, stride = top + 1, top, 2  # offsets from the failure: 1, 3, 7, 15, ...
    while True:
        trial = run(candidates.batch(index))
        trials.append(trial)
        if trial.fits:
            break
        if index == 0:
            return SearchOutcome(None, tuple(trials), model, "min_batch_size_failed")
        high, index, stride = index, max(0, index - stride), 2 * stride
    low = index
    while high - low > 1:
        middle = (low + high) // 2
        trial = run(candidates.batch(middle))
        trials.append(trial)
        low, high = (middle, high) if trial.fits else (low, middle)
    return SearchOutcome(candidates.batch(low), tuple(trials), model, "boundary")

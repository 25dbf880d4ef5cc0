"""The search arithmetic, free of torch: the largest batch a ``run(batch) -> Trial`` oracle accepts.

It fits a memory model (fixed bytes + bytes per sample) to the trials it has, jumps to the
predicted boundary and confirms it: the answer was run and fitted, and the next larger candidate
was run and failed (or the upper bound was reached). Model-guided steps fall back to bisection
(galloping upwards while no failure is known) whenever they stop halving the interval, so the
trial count is never worse than a binary search's by more than a couple. This module holds the
driver; the strategies are ``policy.search.search_line`` and ``policy.search.search_forecast``, over one
``policy.search.search_state.SearchState``, and the constants a ``policy.search.search_state.Tuning`` it
is handed.
"""

from __future__ import annotations

from collections.abc import Callable

from batchfit.policy.search.search_forecast import ask_forecast, descend, revise_forecast, try_forecast
from batchfit.policy.search.search_line import follow_line, open_search
from batchfit.policy.search.search_state import (
    DEFAULT_TUNING,
    UNPREDICTED,
    Candidates,
    FitForecast,
    Predicted,
    SearchOutcome,
    SearchState,
    SearchStopReason,
    Tuning,
)
from batchfit.policy.search.trial import MemoryModel, Trial

__all__ = [
    "DEFAULT_TUNING",
    "Candidates",
    "FitForecast",
    "Predicted",
    "SearchOutcome",
    "SearchStopReason",
    "Tuning",
    "confirm",
    "search",
    "search_and_confirm",
]


def search(
    run: Callable[[int], Trial],
    candidates: Candidates,
    budget_bytes: int,
    *,
    predicted: Predicted = UNPREDICTED,
    forecast_only: bool = False,
    longer: Callable[[int], Trial] | None = None,
    forecast: FitForecast | None = None,
    tuning: Tuning = DEFAULT_TUNING,
) -> SearchOutcome:
    """Find the largest candidate batch that ``run`` reports as fitting ``budget_bytes``.

    Each trial goes to the first strategy with one to run: the forecast's answer
    (``try_forecast``, asked again where refuted: ``revise_forecast``), the descent below an answer
    of it that failed (``descend``), then the memory line or a safe step (``follow_line``).

    Args:
        predicted: ``prior``, predicted trials (a fake-tensor trace): they inform the line and
            prove nothing, and leave it once a real trial at the ``seed`` refutes them; ``seed``:
            where the real trials start (a predicted answer).
        forecast_only: ``run`` is a predictor: stop where the search would only confirm the
            line's answer (``stop_reason`` "predicted").
        longer: the confirming trial (more steps), run at the ``seed``, for the opening once
            the seed has failed, and for every trial after the opening: each may be the answer,
            so an answer found with it needs no trial of its own (``confirmed``). A trial that
            fails stops at the step it runs out of memory, so the longer trial costs more only
            where it fits.
        forecast: asked once the opening has run, it places the next trials until a real trial
            refutes it.
        tuning: the search's constants (``Tuning``: its margins, its descent, its revisions).
    """
    state = SearchState(
        run,
        candidates,
        budget_bytes,
        tuning,
        longer=longer,
        forecast=forecast,
        forecast_only=forecast_only,
    )
    prior, seed = predicted.prior, predicted.seed
    state.known = {candidates.index_at_most(t.batch_size): t for t in prior if t.outcome != "oom"}
    state.aiming = seed is not None  # the seed, a predicted answer, may be the answer
    state.seeded = seed is not None and forecast is not None  # a saved prediction's seed and replay
    if not open_search(state, seed):
        return state.outcome("min_batch_size_failed")
    state.aiming = True  # every trial past the opening aims at the answer
    # Behind a caching allocator (trials that report reserved bytes) the line's answers are held
    # below it from the start: the allocator needs more than the allocated bytes the line counts.
    state.held = state.known[state.low].reserved_peak_bytes is not None
    ask_forecast(state)
    while True:
        reason = state.stop_reason()
        if reason is not None:
            return state.outcome(reason)
        revise_forecast(state)
        if not (try_forecast(state) or descend(state) or follow_line(state)):
            return state.outcome("predicted")


def search_and_confirm(
    run: Callable[[int], Trial],
    candidates: Candidates,
    budget_bytes: int,
    *,
    predicted: Predicted = UNPREDICTED,
    longer: Callable[[int], Trial] | None = None,
    exact: bool = True,
    forecast: FitForecast | None = None,
    tuning: Tuning = DEFAULT_TUNING,
) -> SearchOutcome:
    """``find``'s whole policy over oracles: ``search`` with ``run``, then the answer confirmed.

    With ``longer`` (a trial of more steps: CUDA's caching allocator fragments over the first
    steps) the search runs it past its opening (and at a ``predicted.seed``), and an answer it did not run
    that way is run again with it and, if it no longer fits, searched below with it. On a device
    that is not ``exact`` (the uncapped CPU, where glibc's heap keeps what a failed trial grew it
    to) the answer is looked at again with ``run`` after an allocator failure. The benchmark's
    replay (``bench/find_replay.py``) runs this same function on recorded trials. ``tuning``: the
    search's constants (``Tuning``).
    """
    outcome = search(
        run, candidates, budget_bytes, predicted=predicted, longer=longer, forecast=forecast, tuning=tuning
    )
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

"""What the search works over: the candidate batch sizes, a forecast, the outcome, and the one
``SearchState`` its strategies (``policy.search.search_line``, ``policy.search.search_forecast``) change."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from batchfit.checks import Candidates as Candidates
from batchfit.policy.search.trial import MemoryModel, Trial

SearchStopReason = Literal[
    "boundary", "max_batch_size", "min_batch_size_failed", "predicted", "smaller_size_failed"
]


class FitForecast(Protocol):
    """What the real trials run so far say of another batch size, before it runs: fits or not,
    None where they cannot say (``policy.allocator.allocation_replay``: a caching allocator's requests,
    replayed)."""

    def fits(self, batch_size: int) -> bool | None: ...

    def evidence(self) -> Hashable:
        """What the answers rest on now (the replay: its pair of recorded trials); where it
        changes, the answers may have."""
        ...


@dataclass(frozen=True)
class SearchOutcome:
    batch_size: int | None
    trials: tuple[Trial, ...]
    memory_model: MemoryModel | None
    stop_reason: SearchStopReason
    confirmed: bool = False  # the answer's own trial was the longer, confirming one, and fitted


@dataclass(frozen=True)
class Tuning:
    """The search's constants, handed to ``policy.search.search.search`` (``DEFAULT_TUNING`` unless a
    caller passes another: ``bench/find_replay.py --set``, the tests). Where their values come
    from: docs/benchmarks.md, "Where the search's constants come from"."""

    #: Behind a caching allocator (trials that report reserved bytes), the line's answers are held
    #: at least this share of the budget below what it predicts (twice that after a held answer
    #: fails, and so on, up to ``max_margin``, past which the search bisects). On an exact device
    #: they are not: a line that overshoots there is wrong in its slope, not short of an
    #: allocator's overhead.
    first_margin: float = 0.02
    max_margin: float = 0.5
    #: The most of a trial's reserved memory read as the allocator's need beside the allocated bytes.
    max_overhead: float = 0.1
    #: How close below the largest fitting trial a second may be to fit the line through them.
    near: float = 0.875
    #: Or how far below its peak, as a share of that peak.
    near_rise: float = 1 / 32
    #: How far below a forecast's answer that failed the search gallops down before the line
    #: decides: a forecast further off than that is no better a guide than the line.
    descent: float = 1 / 8
    #: The first step down from a forecast's answer that failed, as a share of it (at least one
    #: candidate). Forecasts overshoot by a share of the batch, and what ends the gallop is the
    #: first size that fits: its recorded requests are near the boundary, and the forecast asked
    #: again on them places the answer. A first step of one candidate takes more trials to reach
    #: that size.
    first_descent: float = 1 / 32
    #: Where the gallop's next step would pass ``descent`` below the forecast's answer, it tries
    #: that floor itself before the line decides, if the floor lies more than this many candidates
    #: below the last failure (nearer, as at small batches, the line's next trial is as good).
    floor_gap: int = 16
    #: How many times a forecast that was refuted is asked again, on new evidence (a trial near
    #: its answer that fitted and was recorded), before the bisection or the line alone goes on.
    revisions: int = 2


DEFAULT_TUNING = Tuning()


@dataclass(frozen=True)
class Predicted:
    """What a prediction says before any real trial: ``prior``, its trials (a fake-tensor trace),
    which inform the line and prove nothing, and ``seed``, its answer, where the real trials start."""

    prior: Sequence[Trial] = ()
    seed: int | None = None


#: No prediction: the search opens on its own.
UNPREDICTED = Predicted()


@dataclass
class SearchState:
    """One search, as its strategies leave it: the trials so far, the bracket ``low``/``high``
    (indices into ``candidates``), and what each strategy carries from one trial to the next."""

    # What the search is over: set when it starts.
    run: Callable[[int], Trial]
    candidates: Candidates
    budget_bytes: int
    tuning: Tuning
    longer: Callable[[int], Trial] | None = None  # the confirming trial: more steps
    forecast: FitForecast | None = None
    forecast_only: bool = False  # ``run`` is a predictor: stop where real trials would only confirm
    # The forecast replays a saved prediction's records, which hold a batch large enough to make
    # every request (a reduction's staging buffers): its bands of failures are the curve's.
    seeded: bool = False

    # The trials.
    trials: list[Trial] = field(default_factory=list)  # in the order they ran
    at: dict[int, Trial] = field(default_factory=dict)  # the real trials, by index
    known: dict[int, Trial] = field(default_factory=dict)  # those and a prior's, until refuted
    ran_longer: set[int] = field(default_factory=set)  # indices whose trial was ``longer``'s
    aiming: bool = False  # each trial may be the answer: it runs ``longer``

    # The bracket.
    low: int = -1  # the largest index known to fit (-1: none yet)
    high: int | None = None  # the smallest index known to fail (None: none yet)

    # The forecast's (``policy.search.search_forecast``).
    predicted: int | None = None  # its answer, not yet tried
    evidence: Hashable = None  # what its last answer rested on
    revisions: int = 0  # times it was asked again
    low_forecast: bool = False  # the candidate after its answer fitted: its answer was low
    descent: int = 0  # below its failed answer: candidates below the last failure to try (-1: bisect)
    floor: int = 0  # the lowest index the descent tries
    refuted: int | None = None  # the lowest index of the forecast's band a real trial refuted

    # The line's (``policy.search.search_line``).
    model: MemoryModel | None = None
    widths: list[int] = field(default_factory=list)  # high - low after each trial, once high is known
    distrust: bool = False  # the line's last guess was refuted: take a safe step (bisect or gallop)
    checks_fitted: int = 0  # "low + 1" checks that fitted: the line underestimates here
    stride: int = 2  # the step upwards from low while no failure is known and the line is distrusted
    held: bool = False  # the line's answers are held below it (a caching allocator)
    held_failures: int = 0  # held answers that ran out of memory since the last that fitted
    held_fitted: bool = False  # a held answer has fitted: the margin is measured near the boundary

    def probe(self, index: int) -> Trial:
        """Run the candidate at ``index`` and record its trial; it runs ``longer`` once each trial
        may be the answer (``aiming``, or a failure is known)."""
        trial_of = self.run
        if self.longer is not None and (self.aiming or self.high is not None):
            trial_of = self.longer
            self.ran_longer.add(index)
        trial = trial_of(self.candidates.batch(index))
        self.trials.append(trial)
        self.at[index] = self.known[index] = trial
        return trial

    def stop_reason(self) -> SearchStopReason | None:
        """Why the bracket is closed (None while it is open)."""
        if self.high is None and self.low == self.candidates.count - 1:
            return "max_batch_size"
        if self.high is not None and self.high == self.low + 1:
            return "boundary"
        return None

    def outcome(self, stop_reason: SearchStopReason) -> SearchOutcome:
        """The answer, ``low``, with the trials that found it."""
        if self.low < 0:
            return SearchOutcome(None, tuple(self.trials), None, stop_reason)
        batch_size = self.candidates.batch(self.low)
        return SearchOutcome(
            batch_size, tuple(self.trials), self.model, stop_reason, self.low in self.ran_longer
        )

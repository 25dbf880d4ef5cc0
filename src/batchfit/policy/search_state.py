"""What the search works over: the candidate batch sizes, a forecast, the outcome, and the one
``SearchState`` its strategies (``policy.search_line``, ``policy.search_forecast``) change."""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Literal, Protocol

from batchfit.checks import check_batch_range, check_positive_int
from batchfit.errors import ConfigurationError
from batchfit.policy.trial import MemoryModel, Trial

SearchStopReason = Literal[
    "boundary", "max_batch_size", "min_batch_size_failed", "predicted", "smaller_size_failed"
]


@dataclass(frozen=True)
class Candidates:
    """The batch sizes allowed: multiples of ``multiple_of`` in [min_batch_size, max_batch_size]."""

    first: int
    step: int
    count: int

    @classmethod
    def between(cls, min_batch_size: int, max_batch_size: int, multiple_of: int | None = None) -> Candidates:
        check_batch_range(min_batch_size, max_batch_size)
        step = 1 if multiple_of is None else check_positive_int("multiple_of", multiple_of)
        first = -(-min_batch_size // step) * step
        last = max_batch_size // step * step
        if first > last:
            raise ConfigurationError(
                f"no multiple of {step} lies in [min_batch_size, max_batch_size] = "
                f"[{min_batch_size}, {max_batch_size}]; widen the range or change multiple_of."
            )
        return cls(first, step, (last - first) // step + 1)

    def batch(self, index: int) -> int:
        return self.first + index * self.step

    def index_at_most(self, batch_size: float) -> int:
        """Index of the largest candidate <= batch_size (-1 if none)."""
        return math.floor((batch_size - self.first) / self.step)


class Forecast(Protocol):
    """What the real trials run so far say of another batch size, before it runs: fits or not,
    None where they cannot say (``policy.allocation_replay``: a caching allocator's requests, replayed)."""

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
    """The search's constants, as ``policy.search`` holds them when a search starts (documented
    there; ``bench/find_replay.py --set`` changes them there)."""

    first_margin: float
    max_margin: float
    max_overhead: float
    near: float
    near_rise: float
    descent: float
    first_descent: float
    floor_gap: int
    revisions: int


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
    forecast: Forecast | None = None
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

    # The forecast's (``policy.search_forecast``).
    predicted: int | None = None  # its answer, not yet tried
    evidence: Hashable = None  # what its last answer rested on
    revisions: int = 0  # times it was asked again
    low_forecast: bool = False  # the candidate after its answer fitted: its answer was low
    descent: int = 0  # below its failed answer: candidates below the last failure to try (-1: bisect)
    floor: int = 0  # the lowest index the descent tries
    refuted: int | None = None  # the lowest index of the forecast's band a real trial refuted

    # The line's (``policy.search_line``).
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

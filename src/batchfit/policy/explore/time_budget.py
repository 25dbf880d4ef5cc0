"""The time a timing verb may take, free of torch: a ``TimeBudget`` read on an injected clock, the
share of it a part of the verb is given, and ``NotMeasured``, what a result names when the budget
(or an early verdict) left a part unmeasured, with the time it would have needed.

Every timing verb (``compare``, ``advise``, ``explore``, ``check_data``) keeps one budget: it starts
no part whose expected cost exceeds what is left, so it ends within its budget plus at most one step
of its slowest part, and says what it left out."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from batchfit.checks import check_positive_number


@dataclass
class TimeBudget:
    """``seconds`` from the moment it is made, on ``clock`` (None: no bound)."""

    seconds: float | None
    clock: Callable[[], float] = time.perf_counter
    started: float = field(init=False)

    def __post_init__(self) -> None:
        if self.seconds is not None:
            check_positive_number("time_budget_seconds", self.seconds, allow_zero=True)
        self.started = self.clock()

    def spent(self) -> float:
        """Seconds since the budget was made."""
        return self.clock() - self.started

    def left(self) -> float:
        """Seconds left (``math.inf`` without a bound; never below 0)."""
        if self.seconds is None:
            return math.inf
        return max(0.0, self.seconds - self.spent())

    def allows(self, cost_seconds: float) -> bool:
        """Whether a part expected to take ``cost_seconds`` still fits in what is left."""
        return cost_seconds <= self.left()

    def part(self, share: float) -> TimeBudget:
        """A budget for a part of the verb: ``share`` (0-1] of what is left now, on the same clock
        (no bound where this one has none)."""
        if not 0 < share <= 1:
            raise ValueError(f"share must be in (0, 1], got {share!r}")
        left = self.left()
        return TimeBudget(None if math.isinf(left) else left * share, self.clock)


@dataclass(frozen=True)
class NotMeasured:
    """A part of a verb that was not measured: what (``part``: a technique, a batch size, a setting,
    a step of advise), why, and about how many seconds measuring it would take (None: unknown)."""

    part: str
    reason: str
    needs_seconds: float | None = None

    def line(self) -> str:
        """``amp: not measured (the time budget ran out); about 40 s more would measure it.``"""
        needs = (
            ""
            if self.needs_seconds is None
            else f"; about {math.ceil(self.needs_seconds)} s would measure it"
        )
        return f"{self.part}: not measured ({self.reason}){needs}."

    def to_dict(self) -> dict[str, Any]:
        return {"part": self.part, "reason": self.reason, "needs_seconds": self.needs_seconds}

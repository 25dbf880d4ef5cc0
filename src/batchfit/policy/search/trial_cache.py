"""Trials measured once and judged again under another budget (the analyze report's fractions)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from batchfit.policy.search.trial import Trial, TrialOutcome
from batchfit.policy.search.trial_records import TrialRecords
from batchfit.units import format_bytes


def verdict(peak_bytes: int, budget_bytes: int) -> tuple[TrialOutcome, str]:
    if peak_bytes > budget_bytes:
        return "over_budget", f"peak {format_bytes(peak_bytes)} > budget {format_bytes(budget_bytes)}"
    return "ok", ""


@dataclass
class TrialCache:
    """Trials measured on one workload, mode and device, to be judged again against another budget.

    A real trial ran under a cap at its search's budget. One that completed fits any larger
    budget, and a smaller one that its peaks stay within (the reserved peak where the device
    caches: below it the allocator would have behaved the same); its allocated peak past a budget
    is over that budget. One that ran out of memory fails any budget as small. Anything else is
    run again. A trace (``predicted``) ran uncapped, so its peak is judged against any budget.
    """

    real: dict[int, tuple[Trial, int]] = field(default_factory=dict)  # batch -> (trial, its cap)
    predicted: dict[int, Trial] = field(default_factory=dict)
    # A fitting trial's allocator requests (a caching allocator's): the same under any cap, so
    # every search of the cache hands its trial runners and its replay these.
    records: TrialRecords = field(default_factory=TrialRecords)
    runs: int = 0  # real trials actually run
    traces: int = 0  # fake-tensor traces actually run

    def lookup_real(self, batch_size: int, budget_bytes: int) -> Trial | None:
        """The real trial at ``batch_size`` as it would come out under ``budget_bytes``; None
        when it was not measured or its measurement does not decide."""
        if batch_size not in self.real:
            return None
        trial, cap = self.real[batch_size]
        if trial.outcome == "oom":
            return replace(trial, reused=True) if budget_bytes <= cap else None
        held = trial.peak_bytes if trial.reserved_peak_bytes is None else trial.reserved_peak_bytes
        if budget_bytes >= cap or held <= budget_bytes:
            return replace(trial, outcome="ok", detail="", reused=True)
        if trial.peak_bytes > budget_bytes:
            outcome, detail = verdict(trial.peak_bytes, budget_bytes)
            return replace(trial, outcome=outcome, detail=detail, reused=True)
        return None

    def lookup_predicted(self, batch_size: int, budget_bytes: int) -> Trial | None:
        cached = self.predicted.get(batch_size)
        if cached is None:
            return None
        outcome, detail = verdict(cached.peak_bytes, budget_bytes)
        return replace(cached, outcome=outcome, detail=detail, reused=True)

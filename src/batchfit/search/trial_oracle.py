"""The search's oracle, ``run(batch) -> Trial``: a cached trial where the cache decides, else a real
one on every rank, each told to ``on_progress`` as it starts and ends."""

from __future__ import annotations

import logging

from batchfit.policy.search.trial import Mode, Trial
from batchfit.policy.search.trial_cache import TrialCache
from batchfit.progress import Event, OnProgress, tell
from batchfit.runtime.distributed.lockstep import Alone, Lockstep
from batchfit.runtime.steps.runner import TrialRunner
from batchfit.units import format_bytes

logger = logging.getLogger("batchfit.search.find_batch_size")


class TrialOracle:
    """The search's ``run(batch) -> Trial``: the cached trial where the cache decides, else a real
    one on every rank (cached for the next search); each told as it starts and ends."""

    def __init__(
        self,
        runner: TrialRunner,
        team: Lockstep | Alone,
        mode: Mode,
        budget: int,
        on_progress: OnProgress | None,
        cache: TrialCache | None,
    ) -> None:
        self.runner, self.team, self.cache = runner, team, cache
        self.mode, self.budget, self.on_progress = mode, budget, on_progress

    def __call__(self, batch_size: int) -> Trial:
        mode, budget, on_progress = self.mode, self.budget, self.on_progress
        trial = self.cache.lookup_real(batch_size, budget) if self.cache is not None else None
        if trial is None:
            tell(on_progress, Event("find", "started", mode, batch_size=batch_size))
            # Every rank runs it on its own device; all act on the merged trial.
            trial = self.team.trial(lambda: self.runner.run(batch_size))
            if self.cache is not None:
                self.cache.real[batch_size] = (trial, budget)
                self.cache.runs += 1
            logger.debug(
                "%s trial batch_size=%d: %s, peak %s (budget %s)%s",
                mode,
                batch_size,
                trial.outcome,
                format_bytes(trial.peak_bytes),
                format_bytes(budget),
                f", {trial.step_seconds * 1000:.1f} ms/step" if trial.step_seconds else "",
            )
        tell(on_progress, Event("find", "trial", mode, batch_size=batch_size, trial=trial))
        return trial

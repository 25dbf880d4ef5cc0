"""One search for ``find_batch_size``, decided once (what runs, where, over which candidates, with
which trials, on which ranks): its memory budget and steps, the run of opening and confirming
trials with the fake-tensor and replay forecasts, the band below the answer, and the result."""

from __future__ import annotations

from dataclasses import dataclass, replace

from batchfit.options import BatchSizes, Trials
from batchfit.policy.search.replay_forecast import ReplayForecast
from batchfit.policy.search.safe_band import SafeBand, Under, hold_below
from batchfit.policy.search.search import (
    DEFAULT_TUNING,
    Candidates,
    SearchOutcome,
    Tuning,
    search_and_confirm,
)
from batchfit.policy.search.search_state import Predicted
from batchfit.policy.search.trial import Mode
from batchfit.policy.search.trial_cache import TrialCache
from batchfit.policy.search.trial_records import TrialRecords
from batchfit.progress import OnProgress
from batchfit.runtime.distributed.buckets import opening_steps, reproduced
from batchfit.runtime.distributed.lockstep import Alone, Lockstep, LockstepForecast
from batchfit.runtime.steps.runner import TrialRunner, snapshot_scalers
from batchfit.runtime.steps.state import TrainingSnapshot
from batchfit.runtime.steps.stepping import StepSpec
from batchfit.runtime.steps.trace import TraceForecast, forecast_search
from batchfit.runtime.workloads.workload import Workload
from batchfit.search.search_capacity import does_not_fit
from batchfit.search.search_result import SearchResult
from batchfit.search.starting_evidence import StartingEvidence
from batchfit.search.trial_oracle import TrialOracle
from batchfit.where import ResolvedDevice


@dataclass(frozen=True)
class Search:
    """One search, decided once: what runs (workload, mode), where (the target and the capacity
    its budget is a share of), over which candidates, with which trials, on which ranks."""

    workload: Workload
    mode: Mode
    target: ResolvedDevice
    sizes: BatchSizes
    trials: Trials
    capacity: int
    team: Lockstep | Alone
    cache: TrialCache | None
    on_progress: OnProgress | None
    start: StartingEvidence | None = None  # a saved prediction's records: the first trial's place
    tuning: Tuning = DEFAULT_TUNING  # the search's constants

    @property
    def budget(self) -> int:
        return int(self.target.memory_fraction * self.capacity)

    @property
    def candidates(self) -> Candidates:
        return self.sizes.candidates(self.mode)

    @property
    def opening_steps(self) -> int:
        """The steps of the opening trials (``runtime.distributed.buckets.opening_steps``)."""
        holding = self.target.device.bucket_holding
        return opening_steps(self.trials.steps_per_trial, self.workload.buckets, holding, self.mode)

    @property
    def confirming(self) -> int | None:
        """The steps of the trials after the opening (the answer's among them), where they are
        more than the opening's: a caching allocator fragments over the first steps."""
        asked = self.trials.confirm_steps
        asked = self.target.device.confirm_steps if asked is None else asked
        return asked if asked is not None and asked > self.opening_steps else None

    @property
    def warm_batch(self) -> int | None:
        """An eval search with the training state resident first trains ``Trials.warm_batch_size``,
        by default the smallest candidate."""
        if self.mode != "eval" or not self.trials.eval_with_training_state:
            return None
        return self.trials.warm_batch_size or self.candidates.first

    def seed(self) -> int | None:
        """Where a saved prediction's records place the first trial at this budget (None without
        one)."""
        if self.start is None:
            return None
        steps = self.confirming or self.opening_steps
        return self.start.seed(self.target.device, self.budget, steps, self.candidates, self.must_fit_from)

    @property
    def must_fit_from(self) -> int:
        """The smallest batch the run will see: a dataset's last batch can be any size."""
        if self.sizes.must_fit_from is not None:
            return self.sizes.must_fit_from
        return 1 if self.workload.dataset is not None else self.candidates.first

    def run(
        self, snapshot: TrainingSnapshot, seed: int | None = None
    ) -> tuple[SearchOutcome, TraceForecast, int, SafeBand | None]:
        """The search's outcome, the fake-tensor forecast that placed it (CPU devices) or why none
        did, the sizes the replay of recorded allocator requests was asked about, and the band below
        the answer that fits (caching allocators: ``policy.search.safe_band``)."""
        device, budget, confirming = self.target.device, self.budget, self.confirming
        # Behind a caching allocator the trials add their requests to one owner (the cache's, when
        # searches share one), handed to both runners and the replay: replayed, the opening's place
        # the confirming trials, and a fitting confirming trial's carry a batch near the boundary's.
        records = self.cache.records if self.cache is not None else TrialRecords()
        if self.start is not None:  # a saved prediction's records join the trials' own
            records.join(self.start.shared_records(device))
        spec = StepSpec(
            self.workload,
            device,
            self.mode,
            self.opening_steps,
            warm_batch=self.warm_batch,
            cap_bytes=budget,
            until_steady=True,
            record=confirming is not None,
            scalers=snapshot_scalers(snapshot),
        )
        opening = self.oracle(TrialRunner(spec, snapshot, records), self.cache)
        longer, replay = None, None
        if confirming is not None:  # its record pairs with the opening's: only those steps are taken
            longer_spec = replace(spec, steps=confirming, record_steps=self.opening_steps)
            longer = self.oracle(TrialRunner(longer_spec, snapshot, records), None)
            low = self.must_fit_from  # the search aims at the band holding every smaller batch from it
            replay = self.team.forecast(
                ReplayForecast(records, budget, confirming, device.soft_workspaces, low)
            )
        forecast = self.team.shared(self.forecast)
        traced = forecast.outcome
        outcome = search_and_confirm(
            opening,
            self.candidates,
            budget,
            predicted=Predicted(traced.trials, traced.batch_size) if traced else Predicted(seed=seed),
            longer=longer,
            exact=device.exact,
            forecast=replay,
            tuning=self.tuning,
        )
        replays = 0 if replay is None else replay.replays_run  # the search's (the band's are its own)
        band = None
        if longer is not None and replay is not None and outcome.batch_size is not None:
            outcome, band = self.hold_below(outcome, outcome.batch_size, longer, replay)
        return outcome, forecast, replays, band

    def hold_below(
        self,
        outcome: SearchOutcome,
        answer: int,
        longer: TrialOracle,
        replay: ReplayForecast | LockstepForecast,
    ) -> tuple[SearchOutcome, SafeBand]:
        """The answer lowered to the top of the band that holds every smaller batch the run may
        see, where a size below it fails (which sizes fit is not monotone behind a caching
        allocator); the search's answer stays beside it as the band's ``isolated`` size."""
        # Every rank checks in lockstep, as it searched: its trials agree through ``longer``.
        band, ran = hold_below(
            answer,
            self.must_fit_from,
            self.candidates,
            outcome.trials,
            longer,
            replay.play,
            Under(self.budget, self.capacity, self.confirming or 0),
            replay.above if isinstance(replay, ReplayForecast) else None,  # alone: ranks may differ
        )
        trials = outcome.trials + ran
        if band.high is None or band.high == outcome.batch_size:
            return replace(outcome, trials=trials), band
        return SearchOutcome(band.high, trials, outcome.memory_model, "smaller_size_failed", True), band

    def oracle(self, runner: TrialRunner, cache: TrialCache | None) -> TrialOracle:
        return TrialOracle(runner, self.team, self.mode, self.budget, self.on_progress, cache)

    def forecast(self) -> TraceForecast:
        """The search run on fake-tensor traces, where the device can trace the workload."""
        return forecast_search(
            self.workload,
            self.target.device,
            self.mode,
            self.trials.steps_per_trial,
            self.budget,
            self.warm_batch,
            self.candidates,
            self.cache,
        )

    def result(
        self,
        outcome: SearchOutcome,
        forecast: TraceForecast,
        replays: int,
        seconds: float,
        started_from: int | None = None,
        band: SafeBand | None = None,
    ) -> SearchResult:
        """The answer and its evidence; ``DoesNotFitError`` where even the smallest failed."""
        if outcome.batch_size is None:
            smallest = min(outcome.trials, key=lambda trial: trial.batch_size)
            raise does_not_fit(self.workload, self.mode, self.target, self.capacity, smallest)
        answer = [trial for trial in outcome.trials if trial.batch_size == outcome.batch_size][-1]
        traced = forecast.outcome
        return SearchResult(
            mode=self.mode,
            batch_size=outcome.batch_size,
            peak_bytes=answer.peak_bytes,
            budget_bytes=self.budget,
            capacity_bytes=self.capacity,
            memory_fraction=float(self.target.memory_fraction),
            device=self.target.device.name,
            trials=outcome.trials,
            predicted_trials=traced.trials if traced else (),
            memory_model=outcome.memory_model or (traced.memory_model if traced else None),
            stop_reason=outcome.stop_reason,
            search_seconds=seconds,
            min_batch_size=self.sizes.min_batch_size,
            max_batch_size=self.sizes.upper(self.mode),
            multiple_of=self.sizes.multiple_of,
            steps_per_trial=self.opening_steps,
            confirm_steps=self.confirming,
            world_size=self.team.world_size,
            replays=replays,
            compiled=self.workload.compiled,
            wrapper_bytes=self.workload.wrapper_bytes,
            rebuilt_buckets=reproduced(self.workload.buckets, self.target.device.bucket_holding, self.mode),
            forecast_skipped=forecast.skipped,
            started_from=started_from,
            band=band,
        )

"""``find_batch_size``: the largest batch whose train (or eval) step fits a memory budget."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass
from typing import Any

import torch

from batchfit.errors import ConfigurationError, DoesNotFitError
from batchfit.options import BatchSizes, Target, Trials, Where, mode_named
from batchfit.policy.replay_forecast import ReplayForecast
from batchfit.policy.search import SearchStopReason, search_and_confirm
from batchfit.policy.trial import MemoryModel, Mode, Trial
from batchfit.policy.trial_cache import TrialCache
from batchfit.progress import Event, OnProgress, tell
from batchfit.runtime.devices.device import Device
from batchfit.runtime.devices.oom import fragmented
from batchfit.runtime.devices.tracker import resident_tensors
from batchfit.runtime.distributed.data_parallel import note_unwrapped
from batchfit.runtime.distributed.lockstep import Alone, Lockstep, LockstepForecast, ranks
from batchfit.runtime.steps.runner import TrialRunner
from batchfit.runtime.steps.state import TrainingSnapshot
from batchfit.runtime.steps.trace import forecast_search
from batchfit.runtime.workloads.workload import Workload, check_model_on
from batchfit.units import format_bytes, format_count

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SearchResult:
    """The answer of a search and the evidence for it."""

    mode: Mode
    batch_size: int
    peak_bytes: int  # measured peak of the answer's trial
    budget_bytes: int  # memory_fraction x capacity_bytes
    capacity_bytes: int
    memory_fraction: float
    device: str
    trials: tuple[Trial, ...]  # real trials, in the order they ran
    predicted_trials: tuple[Trial, ...]  # fake-tensor traces that placed them (CPU devices)
    memory_model: MemoryModel | None
    stop_reason: SearchStopReason
    search_seconds: float
    min_batch_size: int
    max_batch_size: int
    multiple_of: int | None
    steps_per_trial: int
    confirm_steps: int | None  # the answer trained this many steps before it was final (CUDA)
    world_size: int = 1  # ranks that searched in lockstep; the capacity is the smallest one's
    replays: int = 0  # sizes the opening's allocator requests were replayed at, to place the trials
    compiled: tuple[str, ...] = ()  # what of the workload runs torch.compile'd code, measured as it runs
    wrapper_bytes: int = 0  # held beside the model in every trial: a DistributedDataParallel's buckets

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    def summary(self) -> str:
        why = {
            "boundary": "the next larger candidate did not fit",
            "max_batch_size": f"max_batch_size={self.max_batch_size} was reached",
        }.get(self.stop_reason, self.stop_reason)
        traced = (
            f" (placed by {format_count(len(self.predicted_trials), 'fake-tensor trace')})"
            if self.predicted_trials
            else f" (placed by replaying the allocator's requests at {format_count(self.replays, 'size')})"
            if self.replays
            else ""
        )
        ranks = f", the smallest of {self.world_size} ranks" if self.world_size > 1 else ""
        if self.wrapper_bytes:
            ranks += f", DDP's gradient buckets of {format_bytes(self.wrapper_bytes)} held"
        answer = self.answer
        confirmed = f", the answer confirmed over {self.confirm_steps} steps" if self.confirm_steps else ""
        if confirmed and answer.steady_from is not None:
            confirmed += (
                f" (to step {answer.steps}, where the allocator's state repeated its state after step "
                f"{answer.steady_from}: the steps after would repeat steps that ran)"
            )
        retries = answer.allocator_retries
        retried = (
            f" Its steps needed {retries} allocator retries under the cap (the allocator freed its "
            f"cache to go on, which costs time); a smaller batch may train faster."
            if retries
            else ""
        )
        compiled = (
            f" The step runs torch.compile'd code ({', '.join(self.compiled)}), measured as it runs"
            + (", from the CPU allocator's events." if self.device.startswith("cpu") else ".")
            if self.compiled
            else ""
        )
        return (
            f"{self.mode}: batch_size={self.batch_size} (peak {format_bytes(self.peak_bytes)} of a "
            f"{format_bytes(self.budget_bytes)} budget = {self.memory_fraction:g} x "
            f"{format_bytes(self.capacity_bytes)} on {self.device}{ranks}); "
            f"{format_count(len(self.trials), 'trial')}"
            f"{traced}{confirmed} in {self.search_seconds:.2f} s; stopped because {why}."
            f"{self._fragmentation()}{retried}{compiled}"
        )

    def _fragmentation(self) -> str:
        """Where the next larger candidate ran out of memory with room in the allocator's cache, not
        in one piece: a sentence that says so (CUDA's allocator, or its model)."""
        above = [t for t in self.trials if t.outcome == "oom" and t.batch_size > self.batch_size]
        if self.stop_reason != "boundary" or not above:
            return ""
        nearest = min(above, key=lambda trial: trial.batch_size)
        found = fragmented(nearest.detail)
        if found is None:
            return ""
        asked, held = found
        return (
            f" Batch {nearest.batch_size} ran out of memory asking for {format_bytes(asked)} while the "
            f"allocator held {format_bytes(held)} reserved but unallocated: room, not in one piece "
            f"(fragmentation). Expandable segments may fit more: `batchfit compare --techniques "
            f"expandable-segments` measures them."
        )

    @property
    def answer(self) -> Trial:
        """The last real trial at the answer: its peaks and allocator retries are the evidence."""
        return [trial for trial in self.trials if trial.batch_size == self.batch_size][-1]


def find_batch_size(
    workload: Workload,
    mode: Mode = "train",
    *,
    device: str | torch.device | None = None,
    memory_limit: str | int | None = None,
    memory_fraction: float = 0.8,
    sizes: BatchSizes = BatchSizes(),
    trials: Trials = Trials(),
    on_progress: OnProgress | None = None,
) -> SearchResult:
    """Find the largest batch in ``sizes`` whose ``mode`` steps complete under a hard cap at
    ``memory_fraction`` x the device's memory, leaving model, optimizer and RNG exactly as they were.

    ``device`` is ``"cpu"``, ``"cuda"`` or ``"cuda:N"`` (default: cuda if available); with
    ``memory_limit`` (e.g. ``"2GiB"``) the device's capacity is that size (a smaller GPU, or a
    CPU standing in for one). ``mode`` is ``"train"`` or ``"eval"`` (``"val"`` too).
    The opening trials run ``trials.steps_per_trial`` steps; every later one, which may be the
    answer, runs ``trials.confirm_steps`` (default: 10 on CUDA, whose caching allocator fragments
    over the first steps; none on the CPU); an answer not found by such a trial runs them once
    more and, if they no longer fit, the search goes on below it. On CUDA the trials record their
    allocator requests, whose replay at other sizes places the later trials
    (``SearchResult.replays``). For ``mode="eval"`` with ``trials.eval_with_training_state`` the
    eval step is measured with gradients and optimizer state resident, as when validation runs
    inside a training loop. ``on_progress`` hears each trial start and end (``batchfit.Event``).
    """
    target = Target.of(Where(device, memory_limit, memory_fraction))
    return find_on(target, workload, mode_named(mode), sizes, trials, on_progress)


def find_on(
    target: Target,
    workload: Workload,
    mode: Mode,
    sizes: BatchSizes = BatchSizes(),
    trials: Trials = Trials(),
    on_progress: OnProgress | None = None,
    cache: TrialCache | None = None,
) -> SearchResult:
    """``find_batch_size`` on a resolved target (explore, compare and analyze search on theirs); a
    ``cache`` shared by searches of one workload, mode and device (at other fractions) reuses
    their measurements instead of running them again."""
    device = target.device
    candidates = sizes.candidates(mode)
    asked = device.confirm_steps if trials.confirm_steps is None else trials.confirm_steps
    confirming = asked if asked is not None and asked > trials.steps_per_trial else None
    team = ranks()  # under torch.distributed every rank searches together
    # A rank whose workload is wrong stops every rank, not only itself.
    team.run(lambda: _check_workload(workload, mode, device))
    if team.world_size > 1:
        note_unwrapped(workload.model, team.world_size)
    started = time.perf_counter()
    snapshot = TrainingSnapshot.capture(
        workload.module,
        workload.optimizer if isinstance(workload.optimizer, torch.optim.Optimizer) else None,
        workload.functions,
    )
    try:
        snapshot.set_gradients_aside()
        # With several ranks the answer must fit the smallest device: one budget for all.
        capacity = min(team.run(lambda: _capacity(workload, device)))
        budget = int(target.memory_fraction * capacity)
        warm_batch = candidates.first if mode == "eval" and trials.eval_with_training_state else None
        search = _Search(
            workload, device, mode, trials, budget, snapshot, warm_batch, confirming, team, cache, on_progress
        )
        forecast = team.shared(
            lambda: forecast_search(
                workload, device, mode, trials.steps_per_trial, budget, warm_batch, candidates, cache
            )
        )
        outcome = search_and_confirm(
            search.oracle(),
            candidates,
            budget,
            prior=forecast.trials if forecast else (),
            seed=forecast.batch_size if forecast else None,
            longer=search.confirming_oracle(),
            exact=device.exact,
            forecast=search.replay,
        )
    finally:
        snapshot.restore(gradients=True)
        device.release()
    if outcome.batch_size is None:
        smallest = min(outcome.trials, key=lambda trial: trial.batch_size)
        raise _does_not_fit(workload, mode, device, smallest, budget, capacity, target.memory_fraction)
    answer = [t for t in outcome.trials if t.batch_size == outcome.batch_size][-1]
    return SearchResult(
        mode=mode,
        batch_size=outcome.batch_size,
        peak_bytes=answer.peak_bytes,
        budget_bytes=budget,
        capacity_bytes=capacity,
        memory_fraction=float(target.memory_fraction),
        device=device.name,
        trials=outcome.trials,
        predicted_trials=forecast.trials if forecast else (),
        memory_model=outcome.memory_model or (forecast.memory_model if forecast else None),
        stop_reason=outcome.stop_reason,
        search_seconds=time.perf_counter() - started,
        min_batch_size=sizes.min_batch_size,
        max_batch_size=sizes.upper(mode),
        multiple_of=sizes.multiple_of,
        steps_per_trial=trials.steps_per_trial,
        confirm_steps=confirming,
        world_size=team.world_size,
        replays=search.replay.replays_run if search.replay is not None else 0,
        compiled=workload.compiled,
        wrapper_bytes=workload.wrapper_bytes,
    )


def _capacity(workload: Workload, device: Device) -> int:
    """The device's capacity for this workload: what its resident tensors leave room for."""
    held = resident_tensors(workload.module, workload.optimizer, *workload.reached)
    return device.capacity_bytes(held, workload.wrapper_bytes)


class _Search:
    """What one search runs its trials with: the opening's runner and, behind a caching allocator,
    the confirming trials' runner and the replay of their recorded requests. Both runners record
    into one store of records (the cache's, when searches share one), which the replay reads."""

    def __init__(
        self,
        workload: Workload,
        device: Device,
        mode: Mode,
        trials: Trials,
        budget: int,
        snapshot: TrainingSnapshot,
        warm_batch: int | None,
        confirming: int | None,
        team: Lockstep | Alone,
        cache: TrialCache | None,
        on_progress: OnProgress | None,
    ) -> None:
        # An eval search with the training state resident trains the smallest candidate first.
        self.warm_batch = warm_batch
        self.budget, self.team, self.cache, self.on_progress = budget, team, cache, on_progress
        records = cache.records if cache is not None else {}
        # Behind a caching allocator the trials record their requests: replayed at other sizes
        # (policy.allocation_replay), the opening's place the confirming trials, and a confirming
        # trial's that fitted carry a batch near the boundary's requests (on every rank alike).
        record = confirming is not None
        self.runner = TrialRunner(
            workload, device, mode, trials.steps_per_trial, budget, snapshot, self.warm_batch, record=record
        )
        self.runner.records = records
        self.confirmer: TrialRunner | None = None
        self.replay: ReplayForecast | LockstepForecast | None = None
        if confirming is not None:
            # Its record pairs with the opening's, of steps_per_trial steps: only those are taken.
            self.confirmer = TrialRunner(
                workload,
                device,
                mode,
                confirming,
                budget,
                snapshot,
                self.warm_batch,
                record=record,
                record_steps=trials.steps_per_trial,
            )
            self.confirmer.records = records
            self.replay = team.forecast(ReplayForecast(records, budget, confirming, device.soft_workspaces))

    def oracle(self) -> _Oracle:
        """The opening's trials, through the cache when there is one."""
        return _Oracle(self.runner, self.budget, self.cache, self.on_progress, self.team)

    def confirming_oracle(self) -> _Oracle | None:
        """The confirming trials (never cached: they decide the answer), or None on an exact device."""
        if self.confirmer is None:
            return None
        return _Oracle(self.confirmer, self.budget, None, self.on_progress, self.team)


class _Oracle:
    """The search's ``run(batch) -> Trial``: the cached trial where the cache decides, else a real
    one on every rank (cached for the next search); each reported as it starts and ends."""

    def __init__(
        self,
        runner: TrialRunner,
        budget: int,
        cache: TrialCache | None,
        on_progress: OnProgress | None,
        team: Lockstep | Alone,
    ) -> None:
        self.runner, self.budget, self.cache, self.team = runner, budget, cache, team
        self.on_progress = on_progress

    def __call__(self, batch_size: int) -> Trial:
        mode = self.runner.mode
        trial = self.cache.lookup_real(batch_size, self.budget) if self.cache is not None else None
        if trial is None:
            tell(self.on_progress, Event("find", "started", mode, batch_size=batch_size))
            # Every rank runs it on its own device; all act on the merged trial.
            trial = self.team.trial(lambda: self.runner.run(batch_size))
            if self.cache is not None:
                self.cache.real[batch_size] = (trial, self.budget)
                self.cache.runs += 1
            logger.debug(
                "%s trial batch_size=%d: %s, peak %s (budget %s)%s",
                mode,
                batch_size,
                trial.outcome,
                format_bytes(trial.peak_bytes),
                format_bytes(self.budget),
                f", {trial.step_seconds * 1000:.1f} ms/step" if trial.step_seconds else "",
            )
        tell(self.on_progress, Event("find", "trial", mode, batch_size=batch_size, trial=trial))
        return trial


def _check_workload(workload: Workload, mode: Mode, device: Device) -> None:
    """The mode is one, it can run on this workload, and the model is on the search's device."""
    if mode not in ("train", "eval"):
        raise ConfigurationError(f"mode={mode!r} is not a mode: use 'train' or 'eval'.")
    if mode == "train" and workload.optimizer is None and workload.train_step is None:
        raise ConfigurationError(
            "mode='train' needs Workload.optimizer (an Optimizer or a factory of one) "
            "or a train_step(model, optimizer, batch) function."
        )
    check_model_on(workload.module, device.torch_device)
    if workload.compiled and not device.measures_compiled:
        raise ConfigurationError(
            f"{device.name} cannot measure a torch.compile'd step ({', '.join(workload.compiled)}): "
            f"its modelled allocator sees what a dispatch mode sees, and Dynamo runs the step eagerly "
            f"under one. Use --device cpu (which reads the allocator's own events) or a GPU."
        )


def _does_not_fit(
    workload: Workload,
    mode: Mode,
    device: Device,
    trial: Trial,
    budget: int,
    capacity: int,
    memory_fraction: float,
) -> DoesNotFitError:
    weights = sum(t.untyped_storage().nbytes() for t in resident_tensors(workload.module))
    buckets = (
        f" (and DDP's gradient buckets {format_bytes(workload.wrapper_bytes)} beside them)"
        if workload.wrapper_bytes
        else ""
    )
    measured = (
        f"it ran out of memory ({trial.detail})"
        if trial.outcome == "oom"
        else f"its peak was {format_bytes(trial.peak_bytes)}"
    )
    return DoesNotFitError(
        f"the {mode} step does not fit even at batch_size={trial.batch_size} on {device.name}: "
        f"{measured}, against a budget of {format_bytes(budget)} ({memory_fraction:g} x "
        f"{format_bytes(capacity)}). The fixed part alone, parameters and buffers, takes "
        f"{format_bytes(weights)}{buckets} before gradients, optimizer state and activations. Raise "
        f"memory_limit, or memory_fraction={memory_fraction:g} toward 1, or shrink the fixed part "
        f"(mixed precision, a lighter optimizer, activation checkpointing)."
    )

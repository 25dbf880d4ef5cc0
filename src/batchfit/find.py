"""``find_batch_size``: the largest batch whose train (or eval) step fits a memory budget."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch

from batchfit.checks import check_memory_fraction, check_positive_int, default_max_batch_size
from batchfit.errors import ConfigurationError, DoesNotFitError
from batchfit.policy.replay_forecast import ReplayForecast
from batchfit.policy.search import Candidates, SearchOutcome, StopReason, search_and_confirm
from batchfit.policy.trial import MemoryModel, Mode, Trial
from batchfit.policy.trial_cache import TrialCache
from batchfit.runtime.devices.device import Device
from batchfit.runtime.devices.oom import fragmented
from batchfit.runtime.devices.resolve import resolve_device
from batchfit.runtime.devices.tracker import resident_tensors
from batchfit.runtime.distributed.data_parallel import note_unwrapped
from batchfit.runtime.distributed.lockstep import Lockstep, LockstepForecast
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
    stop_reason: StopReason
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
    min_batch_size: int = 1,
    max_batch_size: int | None = None,
    multiple_of: int | None = None,
    steps_per_trial: int = 2,
    confirm_steps: int | None = None,
    eval_with_training_state: bool = True,
    on_trial: Callable[[Trial], None] | None = None,
    on_trial_start: Callable[[int], None] | None = None,
    cache: TrialCache | None = None,
) -> SearchResult:
    """Find the largest batch in [min_batch_size, max_batch_size] whose ``mode`` steps complete under a hard
    cap at ``memory_fraction`` x the device's memory, leaving model, optimizer and RNG exactly as they were.

    ``device`` is ``"cpu"``, ``"cuda"`` or ``"cuda:N"`` (default: cuda if available); with
    ``memory_limit`` (e.g. ``"2GiB"``) the device's capacity is that size (a smaller GPU, or a
    CPU standing in for one).
    The opening trials run ``steps_per_trial`` steps; every later one, which may be the answer,
    runs ``confirm_steps`` (default: 10 on CUDA, whose caching allocator fragments over the first
    steps; none on the CPU); an answer not found by such a trial runs them once more and, if they
    no longer fit, the search goes on below it. On CUDA the trials record their allocator
    requests, whose replay at other sizes places the later trials (``SearchResult.replays``).
    For ``mode="eval"`` with ``eval_with_training_state`` the eval step is measured with
    gradients and optimizer state resident, as when validation runs inside a training loop.
    ``on_trial_start(batch_size)`` and ``on_trial(trial)`` report progress. A ``cache`` shared by
    searches of the same workload, mode and device (at other fractions, say) reuses their
    measurements instead of running them again.
    """
    return find_on(
        resolve_device(device, memory_limit),
        workload,
        mode,
        memory_fraction=memory_fraction,
        min_batch_size=min_batch_size,
        max_batch_size=max_batch_size,
        multiple_of=multiple_of,
        steps_per_trial=steps_per_trial,
        confirm_steps=confirm_steps,
        eval_with_training_state=eval_with_training_state,
        on_trial=on_trial,
        on_trial_start=on_trial_start,
        cache=cache,
    )


def find_on(
    target: Device,
    workload: Workload,
    mode: Mode = "train",
    *,
    memory_fraction: float = 0.8,
    min_batch_size: int = 1,
    max_batch_size: int | None = None,
    multiple_of: int | None = None,
    steps_per_trial: int = 2,
    confirm_steps: int | None = None,
    eval_with_training_state: bool = True,
    on_trial: Callable[[Trial], None] | None = None,
    on_trial_start: Callable[[int], None] | None = None,
    cache: TrialCache | None = None,
) -> SearchResult:
    """``find_batch_size`` on a device already resolved (``explore`` searches on the one it times)."""
    check_memory_fraction(memory_fraction)
    check_positive_int("steps_per_trial", steps_per_trial)
    if confirm_steps is not None:
        check_positive_int("confirm_steps", confirm_steps)
    asked = target.confirm_steps if confirm_steps is None else confirm_steps
    confirming = asked if asked is not None and asked > steps_per_trial else None
    if max_batch_size is None:
        max_batch_size = default_max_batch_size(mode)
    candidates = Candidates.between(min_batch_size, max_batch_size, multiple_of)
    lockstep = Lockstep.current()  # under torch.distributed every rank searches together
    if lockstep is None:
        _check_workload(workload, mode, target)
    else:  # a rank whose workload is wrong stops every rank, not only itself
        lockstep.run(lambda: _check_workload(workload, mode, target))
        note_unwrapped(workload.model, lockstep.world_size)

    started = time.perf_counter()
    snapshot = TrainingSnapshot.capture(
        workload.module,
        workload.optimizer if isinstance(workload.optimizer, torch.optim.Optimizer) else None,
        workload.functions,
    )
    try:
        snapshot.set_gradients_aside()

        def prepare() -> int:
            held = resident_tensors(workload.module, workload.optimizer, *workload.reached)
            return target.capacity_bytes(held, workload.wrapper_bytes)

        # With several ranks the answer must fit the smallest device: one budget for all.
        capacity = prepare() if lockstep is None else min(lockstep.run(prepare))
        budget = int(memory_fraction * capacity)
        warm_batch = candidates.first if mode == "eval" and eval_with_training_state else None
        # Behind a caching allocator the trials record their requests: replayed at other sizes
        # (policy.allocation_replay), the opening's place the confirming trials, and a confirming
        # trial's that fitted carry a batch near the boundary's requests (on every rank alike).
        record = confirming is not None
        runner = TrialRunner(
            workload, target, mode, steps_per_trial, budget, snapshot, warm_batch, record=record
        )
        if cache is not None:  # another fraction's search recorded them: a cached trial runs nothing
            runner.records = cache.records

        def forecast_here() -> SearchOutcome | None:
            return forecast_search(
                workload, target, mode, steps_per_trial, budget, warm_batch, candidates, cache
            )

        forecast = forecast_here() if lockstep is None else lockstep.shared(forecast_here)
        replay: ReplayForecast | LockstepForecast | None = None
        if confirming is not None:
            replay = ReplayForecast(runner.records, budget, confirming, target.soft_workspaces)
            replay = replay if lockstep is None else LockstepForecast(replay, lockstep)
        run = _Oracle(runner, budget, cache, on_trial, on_trial_start, lockstep)
        longer = None
        if confirming is not None:
            # Its record pairs with the opening's, of steps_per_trial steps: only those are taken.
            confirmer = TrialRunner(
                workload,
                target,
                mode,
                confirming,
                budget,
                snapshot,
                warm_batch,
                record=record,
                record_steps=steps_per_trial,
            )
            confirmer.records = runner.records
            longer = _Oracle(confirmer, budget, None, on_trial, on_trial_start, lockstep)
        outcome = search_and_confirm(
            run,
            candidates,
            budget,
            prior=forecast.trials if forecast else (),
            seed=forecast.batch_size if forecast else None,
            longer=longer,
            exact=target.exact,
            forecast=replay,
        )
    finally:
        snapshot.restore(gradients=True)
        target.release()
    elapsed = time.perf_counter() - started
    if outcome.batch_size is None:
        smallest = min(outcome.trials, key=lambda trial: trial.batch_size)
        raise _does_not_fit(workload, mode, target, smallest, budget, capacity, memory_fraction)
    answer = [t for t in outcome.trials if t.batch_size == outcome.batch_size][-1]
    return SearchResult(
        mode=mode,
        batch_size=outcome.batch_size,
        peak_bytes=answer.peak_bytes,
        budget_bytes=budget,
        capacity_bytes=capacity,
        memory_fraction=float(memory_fraction),
        device=target.name,
        trials=outcome.trials,
        predicted_trials=forecast.trials if forecast else (),
        memory_model=outcome.memory_model or (forecast.memory_model if forecast else None),
        stop_reason=outcome.stop_reason,
        search_seconds=elapsed,
        min_batch_size=min_batch_size,
        max_batch_size=max_batch_size,
        multiple_of=multiple_of,
        steps_per_trial=steps_per_trial,
        confirm_steps=confirming,
        world_size=1 if lockstep is None else lockstep.world_size,
        replays=replay.replays_run if replay is not None else 0,
        compiled=workload.compiled,
        wrapper_bytes=workload.wrapper_bytes,
    )


class _Oracle:
    """The search's ``run(batch) -> Trial``: the cached trial where the cache decides, else a real
    one (cached for the next search); each reported to the callbacks."""

    def __init__(
        self,
        runner: TrialRunner,
        budget: int,
        cache: TrialCache | None,
        on_trial: Callable[[Trial], None] | None,
        on_trial_start: Callable[[int], None] | None,
        lockstep: Lockstep | None = None,
    ) -> None:
        self.runner, self.budget, self.cache, self.lockstep = runner, budget, cache, lockstep
        self.on_trial, self.on_trial_start = on_trial, on_trial_start

    def __call__(self, batch_size: int) -> Trial:
        trial = self.cache.lookup_real(batch_size, self.budget) if self.cache is not None else None
        if trial is None:
            if self.on_trial_start is not None:
                self.on_trial_start(batch_size)
            if self.lockstep is None:
                trial = self.runner.run(batch_size)
            else:  # every rank runs it on its own device; all act on the merged trial
                trial = self.lockstep.trial(lambda: self.runner.run(batch_size))
            if self.cache is not None:
                self.cache.real[batch_size] = (trial, self.budget)
                self.cache.runs += 1
            logger.debug(
                "%s trial batch_size=%d: %s, peak %s (budget %s)%s",
                self.runner.mode,
                batch_size,
                trial.outcome,
                format_bytes(trial.peak_bytes),
                format_bytes(self.budget),
                f", {trial.step_seconds * 1000:.1f} ms/step" if trial.step_seconds else "",
            )
        if self.on_trial is not None:
            self.on_trial(trial)
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

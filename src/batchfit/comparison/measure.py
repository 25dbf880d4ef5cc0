"""compare's measurements of its rows within one time budget: a probe step against the baseline's,
a search, explore's recommendation, and the speed rounds that time every row in turn."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from batchfit.comparison.comparison import ComparisonRow
from batchfit.errors import ConfigurationError, DoesNotFitError
from batchfit.exploration.explore import explore_on
from batchfit.options import BatchSizes, Timing
from batchfit.policy.explore.techniques import ACCUMULATION, setting_name
from batchfit.policy.explore.time_budget import NotMeasured, TimeBudget
from batchfit.policy.plan.micro_batch import chosen_micro_batch
from batchfit.progress import Event, OnProgress, tell
from batchfit.runtime.distributed.lockstep import ranks
from batchfit.runtime.steps.techniques import applied
from batchfit.runtime.steps.timer import MIN_WINDOW_SECONDS, StepTimer
from batchfit.runtime.workloads.workload import Workload
from batchfit.search.find_batch_size import find_on
from batchfit.where import ResolvedDevice

#: explore's time at each row's largest batch: this share of what is left, at most EXPLORE_SECONDS.
EXPLORE_SHARE = 0.1
EXPLORE_SECONDS = 10.0
#: Steps a probe takes at most: a first step pays one-time costs that a second does not.
PROBE_STEPS = 2
#: The baseline's probe, the denominator of every step ratio, takes the fastest of more steps: one
#: step slowed by a busy machine would make every technique look fast.
BASELINE_PROBE_STEPS = 5


@dataclass
class _Measure:
    """The measurements of the rows within ``budget``, and what the budget left out."""

    workload: Workload
    target: ResolvedDevice
    sizes: BatchSizes
    timing: Timing
    on_progress: OnProgress | None
    budget: TimeBudget
    block: str | None
    budget_bytes: int | None = None  # the searches' budget, once one has run
    not_measured: list[NotMeasured] = field(default_factory=list)
    stepping_seconds: float = 0.0  # every step the speed rounds ran
    readings: int = 0
    baseline_step: tuple[int, float] | None = None  # the probes' batch and a baseline step there
    first_trial_batch: int | None = None  # the batch the first search began at
    recommending: bool = True  # explore's recommendation at each row's largest batch

    def say(self, label: str, message: str) -> None:
        left = self.budget.left()
        time_left = "" if math.isinf(left) else f" ({left:.0f} s left)"
        tell(self.on_progress, Event("compare", "note", label, message=f"{message}{time_left}"))

    def fits(self, cost_seconds: float) -> bool:
        """Whether a part of ``cost_seconds`` fits in what is left: rank 0's answer on every rank
        under a process group, so that the ranks start the same parts."""
        return ranks().shared(lambda: self.budget.allows(cost_seconds))

    def probe(
        self, parts: tuple[str, ...], batch_size: int, below: float = 0.0, most: int = PROBE_STEPS
    ) -> float:
        """One step's seconds of the setting at ``batch_size`` (the slowest rank's): the fastest
        of up to ``most`` steps, stopping at one under ``below`` or when the budget cannot pay for
        another."""
        device, team = self.target.device, ranks()
        with (
            applied(self.workload, parts, device.torch_device, block=self.block) as (variant, _),
            StepTimer(variant, device, 1) as timer,
        ):
            fastest = max(team.run(lambda: timer.step_seconds(batch_size)))
            for _ in range(most - 1):
                if fastest < below or not self.fits(fastest):
                    break
                fastest = min(fastest, max(team.run(lambda: timer.step_seconds(batch_size))))
            return fastest

    def row(self, parts: tuple[str, ...], step_ratio: float | None = None) -> ComparisonRow:
        name, started = setting_name(parts), time.perf_counter()
        self.say(name, f"{name}: searching the largest batch")
        device = self.target.device.torch_device
        with applied(self.workload, parts, device, block=self.block) as (variant, how):
            try:
                result = find_on(self.target, variant, "train", self.sizes, on_progress=self._told(name))
            except DoesNotFitError as error:
                return ComparisonRow(name, True, f"{how}; {error}", seconds=time.perf_counter() - started)
            self.budget_bytes = result.budget_bytes
            if self.first_trial_batch is None and result.trials:
                self.first_trial_batch = result.trials[0].batch_size
            recommended, recommended_speed = self.recommend(name, variant, result.batch_size)
        model = result.memory_model
        return ComparisonRow(
            name,
            True,
            how,
            batch_size=result.batch_size,
            peak_bytes=result.peak_bytes,
            bytes_per_sample=None if model is None else model.bytes_per_sample,
            fixed_bytes=None if model is None else model.fixed_bytes,
            recommended_batch_size=recommended,
            recommended_samples_per_second=recommended_speed,
            at_max_batch_size=result.stop_reason == "max_batch_size",
            trials=len(result.trials),
            seconds=time.perf_counter() - started,
            step_ratio=step_ratio,
        )

    def _told(self, technique: str) -> OnProgress | None:
        """The progress callback, each trial told as compare's, labelled with ``technique``."""
        if self.on_progress is None:
            return None
        on_progress = self.on_progress
        return lambda event: on_progress(event.relabelled("compare", technique))

    def accumulation(self, baseline: ComparisonRow, global_batch_size: int) -> ComparisonRow:
        """The baseline's largest batch (or a divisor of the global batch below it) as the
        micro-batch, accumulated to ``global_batch_size``."""
        if baseline.batch_size is None:
            return ComparisonRow(ACCUMULATION, False, "the baseline has no batch that fits to accumulate")
        try:
            micro = chosen_micro_batch(global_batch_size, 1, baseline.batch_size)
        except ConfigurationError as error:
            return ComparisonRow(ACCUMULATION, False, str(error))
        steps = global_batch_size // micro
        return ComparisonRow(
            ACCUMULATION,
            True,
            f"global_batch_size {global_batch_size} = micro_batch_size {micro} x {steps} accumulation steps "
            f"per optimizer step",
            batch_size=micro,
            accumulation_steps=steps,
        )

    def recommend(self, name: str, workload: Workload, batch_size: int) -> tuple[int | None, float | None]:
        """Explore's recommendation up to ``batch_size`` and its throughput, in a share of what
        is left (None, None when not recommending or too little is left)."""
        seconds = ranks().shared(lambda: min(EXPLORE_SECONDS, self.budget.left() * EXPLORE_SHARE))
        if not self.recommending:
            return None, None
        if seconds < 1:
            self.not_measured.append(
                NotMeasured(f"{name}: explore", "the time budget ran out", EXPLORE_SECONDS)
            )
            return None, None
        self.say(name, f"{name}: explore up to batch_size {batch_size} for {seconds:.0f} s")
        sizes = replace(self.sizes, min_batch_size=min(self.sizes.min_batch_size, batch_size))
        sizes = replace(sizes, max_batch_size=batch_size)
        # Explore's own windows (it needs two or more per size); compare's steps and unit.
        timing = replace(self.timing, windows=Timing().windows, time_budget_seconds=seconds)
        result = explore_on(self.target, workload, sizes, timing)
        chosen = result.recommendation.batch_size
        return chosen, result.estimates()[chosen]

    def speeds(self, rows: Sequence[ComparisonRow]) -> dict[int, list[float]]:
        """Each measured row's throughput readings (index -> samples or tokens per second, one per
        round), each round timing one window of every row in turn (accumulation: per optimizer
        step of micro-batch x steps samples); under a process group, the slowest rank's. A row is
        warmed once, in the first round; later rounds time its window at once. A round starts
        only if its expected cost (each row's last window) fits in what is left."""
        timed = {index: row for index, row in enumerate(rows) if row.applied and row.batch_size is not None}
        readings: dict[int, list[float]] = {}
        windows: dict[int, tuple[int, float]] = {}  # index -> (steps per window, its seconds)
        rounds = self.timing.windows
        for round_number in range(1, rounds + 1):
            if round_number > 1:
                cost = sum(seconds for _, seconds in windows.values())
                if not self.fits(cost):
                    part = f"speed rounds {round_number}-{rounds}"
                    needs = cost * (rounds - round_number + 1)
                    self.not_measured.append(NotMeasured(part, "the time budget ran out", needs))
                    break
            for index, row in timed.items():
                if round_number == 1 and index and 0 not in windows:
                    break  # the baseline untimed: no row has a ratio to read
                if round_number == 1 or index in windows:
                    self._reading(index, row, round_number, readings, windows)
        return readings

    def _reading(
        self,
        index: int,
        row: ComparisonRow,
        round_number: int,
        readings: dict[int, list[float]],
        windows: dict[int, tuple[int, float]],
    ) -> None:
        """One timed window of ``row`` (its first: after a warm-up step and a discarded window,
        if the budget allows them), into ``readings``; ``windows`` keeps its length and cost."""
        batch_size, steps = row.batch_size or 1, row.accumulation_steps or 1
        if index not in windows:
            cost = self._window_estimate(row)
            if not self.fits(cost):
                left_out = NotMeasured(f"{row.technique}: speed", "the time budget ran out", cost)
                self.not_measured.append(left_out)
                return
        self.say(row.technique, f"speed round {round_number}/{self.timing.windows}: {row.technique}")
        parts = tuple(row.technique.split("+")) if index else ()
        device = self.target.device
        tokens = self.timing.tokens_per_sample or self.workload.tokens_per_sample
        variant_of = applied(
            self.workload, parts, device.torch_device, block=self.block, accumulation_steps=steps
        )
        with (
            variant_of as (variant, _),
            StepTimer(variant, device, self.timing.steps_per_window, tokens) as timer,
        ):
            meter = ranks().meter(timer)
            if index in windows:
                timer.resume(batch_size, windows[index][0])
            else:
                meter.first_visit(batch_size)
            before = timer.stepping_seconds
            readings.setdefault(index, []).append(meter.window(batch_size) * steps)
            windows[index] = (timer.steps[batch_size], timer.stepping_seconds - before)
            self.stepping_seconds += timer.stepping_seconds
            self.readings += 1

    def _window_estimate(self, row: ComparisonRow) -> float:
        """A first visit's expected seconds before any window was timed: a warm-up step and two
        windows, a step scaled from the baseline's probe by the batch and the row's step ratio
        (without a probe: half a search trial, which trains two steps)."""
        if self.baseline_step is None:
            step = row.seconds / row.trials / 2 if row.trials else 0.0
        else:
            probe_batch, probe_seconds = self.baseline_step
            batch = (row.batch_size or probe_batch) * (row.accumulation_steps or 1)
            step = probe_seconds * batch / probe_batch * (row.step_ratio or 1.0)
        window = max(
            MIN_WINDOW_SECONDS, step * (self.timing.steps_per_window or self.target.device.min_window_steps)
        )
        return step + 2 * window

"""``compare``: what each technique (mixed precision, activation checkpointing, cuDNN's auto-tuner,
gradient accumulation) buys on the user's own model: the largest memory-safe batch, its memory and
its throughput, against the baseline as given."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
from typing_extensions import Unpack

from batchfit.comparison.comparison import Comparison, ComparisonRow, against
from batchfit.errors import ConfigurationError, DoesNotFitError
from batchfit.exploration.explore import explore_on
from batchfit.options import BatchSizes, Timing, Where
from batchfit.policy.explore.techniques import (
    ACCUMULATION,
    COMPILE,
    Facts,
    default_settings,
    parse_settings,
    repeated_block,
    setting_name,
    why_not,
)
from batchfit.policy.plan.micro_batch import chosen_micro_batch
from batchfit.progress import Event, OnProgress, tell
from batchfit.runtime.devices.allocator_settings import expandable_segments
from batchfit.runtime.devices.device import Device
from batchfit.runtime.distributed.lockstep import ranks
from batchfit.runtime.steps.techniques import (
    applied,
    compiler_unavailable,
    module_blocks,
    runs_bfloat16,
)
from batchfit.runtime.steps.timer import StepTimer
from batchfit.runtime.workloads.default_step import needs_closure
from batchfit.runtime.workloads.entry import check_entry
from batchfit.runtime.workloads.workload import Workload
from batchfit.search.find_batch_size import find_on
from batchfit.where import ResolvedDevice, WhereShorthand, target_of

#: compare's timing unless told: explore gets 10 s for each technique's recommended batch.
COMPARE_TIMING = Timing(time_budget_seconds=10.0)


def compare(
    workload: Workload,
    techniques: Sequence[str] | None = None,
    *,
    where: Where | None = None,
    sizes: BatchSizes = BatchSizes(),
    timing: Timing = COMPARE_TIMING,
    checkpoint_module: str | None = None,
    on_progress: OnProgress | None = None,
    **shorthand: Unpack[WhereShorthand],
) -> Comparison:
    """Apply each technique to ``workload`` (``techniques``: names such as ``amp`` (or ``amp-fp16``,
    ``amp-bf16``), ``checkpointing``, ``amp+checkpointing``, ``cudnn-benchmark-on``,
    ``expandable-segments``, ``accumulation``; None: the defaults for the device) and measure it as
    ``find`` and ``explore`` would: the largest batch in ``sizes`` under a hard cap at
    ``memory_fraction``, its peak and memory line, the throughput at that batch (the median of
    ``timing.windows`` rounds of one window per row) and at explore's recommendation (within
    ``timing.time_budget_seconds``; 0 skips it). ``accumulation`` reaches
    ``sizes.global_batch_size`` with the baseline's largest batch as micro-batch. Checkpointing
    wraps ``checkpoint_module`` (a type name), by default the most repeated block.
    ``on_progress`` hears each trial (labelled with its technique) and each row. The model,
    optimizer and RNG are left as they were.
    ``where`` says where to measure (a ``batchfit.Where``); ``device``, ``memory_limit`` and
    ``memory_fraction`` are its shorthand for the one-line call (one that disagrees with
    ``where`` is a ConfigurationError).
    """
    check_entry("compare", workload, on_progress, sizes=(sizes, BatchSizes), timing=(timing, Timing))
    target = target_of("compare", where, shorthand)
    return compare_on(target, workload, techniques, sizes, timing, checkpoint_module, on_progress)


def compare_on(
    target: ResolvedDevice,
    workload: Workload,
    techniques: Sequence[str] | None = None,
    sizes: BatchSizes = BatchSizes(),
    timing: Timing = COMPARE_TIMING,
    checkpoint_module: str | None = None,
    on_progress: OnProgress | None = None,
) -> Comparison:
    """``compare`` on a resolved target (advise compares on its own)."""
    started = time.perf_counter()
    facts = _facts(workload, target.device, sizes, techniques, checkpoint_module)
    global_batch_size = sizes.global_batch_size
    if techniques is None:
        settings = default_settings(facts, torch.backends.cudnn.benchmark)
    else:  # a global batch asked for is reached with accumulation, named or not
        settings = parse_settings([*techniques, *([ACCUMULATION] if global_batch_size else [])])
    searched = replace(sizes, global_batch_size=None, world_size=None)
    measure = _Measure(workload, target, searched, timing, on_progress)
    rows: list[ComparisonRow] = []
    for parts in settings:
        reason = why_not(parts, facts)
        if reason is not None:
            row = ComparisonRow(setting_name(parts), False, reason)
        elif parts == (ACCUMULATION,):
            row = measure.accumulation(rows[0], global_batch_size or 0)
        else:
            row = measure.row(parts, facts)
        rows.append(row)
        event = Event("compare", "row", row.technique, batch_size=row.batch_size, message=row.line())
        tell(on_progress, event)
    # Every row's throughput in the same rounds, each round over all rows in turn: a drift of
    # the machine's speed (a slow spell) falls on every row alike instead of on one.
    readings = measure.speeds(rows, facts.repeated_block)
    rows = [against(row, rows[0], readings.get(index), readings.get(0)) for index, row in enumerate(rows)]
    return Comparison(
        tuple(rows),
        target.device.name,
        float(target.memory_fraction),
        measure.budget_bytes,
        "tokens/s" if timing.tokens_per_sample or workload.tokens_per_sample else "samples/s",
        global_batch_size,
        time.perf_counter() - started,
    )


def _facts(
    workload: Workload,
    device: Device,
    sizes: BatchSizes,
    techniques: Sequence[str] | None,
    checkpoint_module: str | None,
) -> Facts:
    """What decides which techniques apply to this workload on this device."""
    return Facts(
        cuda=device.torch_device.type == "cuda",
        custom_train_step=workload.train_step is not None,
        repeated_block=checkpoint_module or repeated_block(module_blocks(workload.module)),
        global_batch_size=sizes.global_batch_size,
        bfloat16=runs_bfloat16(device.torch_device),
        closure_optimizer=_needs_closure(workload),
        compiled=workload.compiled,
        expandable_segments=expandable_segments(),
        compiler=(
            compiler_unavailable(device.torch_device.type)
            if any(COMPILE in name.split("+") for name in techniques or ())
            else None
        ),
    )


@dataclass
class _Measure:
    """The measurements of the rows: a search, timing rounds, an exploration, as ``compare`` asks."""

    workload: Workload
    target: ResolvedDevice
    sizes: BatchSizes
    timing: Timing
    on_progress: OnProgress | None
    budget_bytes: int | None = None  # the searches' budget, once one has run

    def row(self, parts: tuple[str, ...], facts: Facts) -> ComparisonRow:
        name, started = setting_name(parts), time.perf_counter()
        device = self.target.device.torch_device
        with applied(self.workload, parts, device, block=facts.repeated_block) as (variant, how):
            try:
                result = find_on(self.target, variant, "train", self.sizes, on_progress=self._told(name))
            except DoesNotFitError as error:
                return ComparisonRow(name, True, f"{how}; {error}", seconds=time.perf_counter() - started)
            self.budget_bytes = result.budget_bytes
            recommended, recommended_speed = self.recommend(variant, result.batch_size)
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

    def speeds(self, rows: Sequence[ComparisonRow], block: str | None) -> dict[int, list[float]]:
        """Each measured row's throughput readings (index -> samples or tokens per second, one per
        round), each round timing one window of every row in turn (accumulation: per optimizer
        step of micro-batch x steps samples); under a process group, the slowest rank's."""
        timed = {index: row for index, row in enumerate(rows) if row.applied and row.batch_size is not None}
        readings: dict[int, list[float]] = {index: [] for index in timed}
        team = ranks()
        for _ in range(self.timing.windows):
            for index, row in timed.items():
                parts = tuple(row.technique.split("+")) if index else ()
                steps = row.accumulation_steps or 1
                device = self.target.device
                variant_of = applied(
                    self.workload, parts, device.torch_device, block=block, accumulation_steps=steps
                )
                with (
                    variant_of as (variant, _),
                    StepTimer(
                        variant,
                        device,
                        self.timing.steps_per_window,
                        self.timing.tokens_per_sample or variant.tokens_per_sample,
                    ) as timer,
                ):
                    meter = team.meter(timer)
                    meter.first_visit(row.batch_size or 1)
                    readings[index].append(meter.window(row.batch_size or 1) * steps)
        return readings

    def recommend(self, workload: Workload, batch_size: int) -> tuple[int | None, float | None]:
        """Explore's recommendation up to ``batch_size`` and its throughput (None, None when
        compare's time budget is 0)."""
        if self.timing.time_budget_seconds == 0:
            return None, None
        sizes = replace(self.sizes, min_batch_size=min(self.sizes.min_batch_size, batch_size))
        sizes = replace(sizes, max_batch_size=batch_size)
        # Explore's own windows (it needs two or more per size); compare's steps, unit and time.
        timing = replace(self.timing, windows=Timing().windows)
        result = explore_on(self.target, workload, sizes, timing)
        chosen = result.recommendation.batch_size
        return chosen, result.estimates()[chosen]


def _needs_closure(workload: Workload) -> bool:
    """Whether the workload's optimizer (built from its factory, which makes no state yet) steps
    only with a closure: a GradScaler cannot step it."""
    optimizer = workload.build_optimizer() if workload.train_step is None else None
    return optimizer is not None and needs_closure(optimizer)

"""``compare``: what each technique (mixed precision, activation checkpointing, cuDNN's auto-tuner,
gradient accumulation) buys on the user's own model: the largest memory-safe batch, its memory and
its throughput, against the baseline as given."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace

import torch
from typing_extensions import Unpack

from batchfit.comparison.comparison import Comparison, ComparisonRow, against
from batchfit.comparison.measure import BASELINE_PROBE_STEPS, PROBE_STEPS, _Measure
from batchfit.options import BatchSizes, Timing, Where
from batchfit.policy.explore.techniques import (
    ACCUMULATION,
    COMPILE,
    SLOW_STEP_RATIO,
    Facts,
    default_settings,
    parse_settings,
    repeated_block,
    setting_name,
    slow_verdict,
    why_not,
)
from batchfit.policy.explore.time_budget import NotMeasured, TimeBudget
from batchfit.progress import Event, OnProgress, tell
from batchfit.runtime.devices.allocator_settings import expandable_segments
from batchfit.runtime.devices.device import Device
from batchfit.runtime.steps.techniques import (
    applied,
    compiler_unavailable,
    module_blocks,
    runs_bfloat16,
)
from batchfit.runtime.workloads.default_step import needs_closure
from batchfit.runtime.workloads.entry import check_entry
from batchfit.runtime.workloads.workload import Workload
from batchfit.where import ResolvedDevice, WhereShorthand, target_of

#: compare's timing unless told: the whole verb's budget, which keeps the README's example (the cnn
#: under a 256 MiB cap) to a few minutes on 2 CPU cores, with or without bfloat16 kernels.
COMPARE_TIMING = Timing(time_budget_seconds=150.0)


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
    ``timing.windows`` rounds of one window per row) and at explore's recommendation (in a tenth
    of what is left, at most 10 s a row). ``accumulation`` reaches ``sizes.global_batch_size``
    with the baseline's largest batch as micro-batch. Checkpointing wraps ``checkpoint_module`` (a
    type name), by default the most repeated block.
    ``timing.time_budget_seconds`` is the whole comparison's: a part (a row's probe, search or
    explore, a speed round) starts only if its cost, estimated from the baseline's, fits in what
    is left, else ``Comparison.not_measured`` names it with the seconds it would need; 0 means no
    bound and no recommendation. A technique whose step is SLOW_STEP_RATIO times the baseline's
    at the baseline's first batch is reported at once, unsearched, unless ``timing.time_slow``.
    ``on_progress`` hears each trial (labelled with its technique), each row, and each part as it
    starts, with the time left. The model, optimizer and RNG are left as they were.
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
    recommend: bool = True,
) -> Comparison:
    """``compare`` on a resolved target (advise compares on its own, without explore's
    recommendation at each row: ``recommend`` False)."""
    started = time.perf_counter()
    facts = _facts(workload, target.device, sizes, techniques, checkpoint_module)
    global_batch_size = sizes.global_batch_size
    if techniques is None:
        settings = default_settings(facts, torch.backends.cudnn.benchmark)
    else:  # a global batch asked for is reached with accumulation, named or not
        settings = parse_settings([*techniques, *([ACCUMULATION] if global_batch_size else [])])
    searched = replace(sizes, global_batch_size=None, world_size=None)
    seconds = None if timing.time_budget_seconds == 0 else timing.time_budget_seconds
    budget = TimeBudget(seconds)
    measure = _Measure(workload, target, searched, timing, on_progress, budget, facts.repeated_block)
    measure.recommending = recommend and timing.time_budget_seconds != 0
    rows: list[ComparisonRow] = []
    for parts in settings:
        row = _row(measure, parts, facts, rows, global_batch_size)
        if row is None:
            continue
        rows.append(row)
        event = Event("compare", "row", row.technique, batch_size=row.batch_size, message=row.line())
        tell(on_progress, event)
    # Every row's throughput in the same rounds, each round over all rows in turn: a drift of
    # the machine's speed (a slow spell) falls on every row alike instead of on one.
    readings = measure.speeds(rows)
    rows = [against(row, rows[0], readings.get(index), readings.get(0)) for index, row in enumerate(rows)]
    return Comparison(
        tuple(rows),
        target.device.name,
        float(target.memory_fraction),
        measure.budget_bytes,
        "tokens/s" if timing.tokens_per_sample or workload.tokens_per_sample else "samples/s",
        global_batch_size,
        time.perf_counter() - started,
        tuple(measure.not_measured),
        measure.stepping_seconds / measure.readings if measure.readings else None,
    )


def _row(
    measure: _Measure,
    parts: tuple[str, ...],
    facts: Facts,
    rows: list[ComparisonRow],
    global_batch_size: int | None,
) -> ComparisonRow | None:
    """The row of one setting: why it does not apply, its verdict when one step is clearly slower
    than the baseline's, or its search; None (and named in ``not_measured``) when the budget
    cannot pay for it."""
    reason = why_not(parts, facts)
    if reason is not None:
        return ComparisonRow(setting_name(parts), False, reason)
    if parts == (ACCUMULATION,):
        return measure.accumulation(rows[0], global_batch_size or 0)
    if not rows:  # the baseline: every other row is measured against it
        return measure.row(parts)
    baseline, name = rows[0], setting_name(parts)
    probe_batch, baseline_step = _baseline_step(measure, baseline)
    if probe_batch is None:
        return measure.row(parts)
    if not measure.fits(PROBE_STEPS * baseline_step):
        measure.not_measured.append(NotMeasured(name, "the time budget ran out", baseline.seconds))
        return None
    measure.say(name, f"{name}: one step at batch_size {probe_batch} against the baseline's")
    step_ratio = measure.probe(parts, probe_batch, SLOW_STEP_RATIO * baseline_step) / baseline_step
    if step_ratio >= SLOW_STEP_RATIO and not measure.timing.time_slow:
        device = measure.target.device.torch_device
        with applied(measure.workload, parts, device, block=facts.repeated_block) as (_, how):
            note = slow_verdict(name, how, step_ratio, probe_batch)
        ratio = 1 / step_ratio
        return ComparisonRow(name, True, note, throughput_ratio=ratio, step_ratio=step_ratio, slow=True)
    cost = baseline.seconds * max(1.0, step_ratio)
    if not measure.fits(cost):
        measure.not_measured.append(NotMeasured(name, "the time budget ran out", cost))
        return None
    return measure.row(parts, step_ratio)


def _baseline_step(measure: _Measure, baseline: ComparisonRow) -> tuple[int | None, float]:
    """The batch the probes step at (the baseline search's first, within its largest) and one
    baseline step's seconds there, timed once and kept on ``measure``."""
    if baseline.batch_size is None:
        return None, 0.0
    if measure.baseline_step is None:
        batch_size = min(measure.first_trial_batch or measure.sizes.min_batch_size, baseline.batch_size)
        measure.baseline_step = (batch_size, measure.probe((), batch_size, most=BASELINE_PROBE_STEPS))
    return measure.baseline_step


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


def _needs_closure(workload: Workload) -> bool:
    """Whether the workload's optimizer (built from its factory, which makes no state yet) steps
    only with a closure: a GradScaler cannot step it."""
    optimizer = workload.build_optimizer() if workload.train_step is None else None
    return optimizer is not None and needs_closure(optimizer)

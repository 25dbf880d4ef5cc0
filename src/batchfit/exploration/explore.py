"""``explore``: training throughput against batch size, up to the memory-safe maximum, with a
live recommendation that settles as evidence comes in. The decisions are the policy's
(``batchfit.policy.explore.exploration``); this module times real steps for it and reports."""

from __future__ import annotations

from dataclasses import replace

from typing_extensions import Unpack

from batchfit.errors import ConfigurationError
from batchfit.exploration.explore_result import ExploreResult
from batchfit.options import BatchSizes, Goal, Timing, Where
from batchfit.policy.explore.choose import Recommendation
from batchfit.policy.explore.exploration import Rules, explore_rounds
from batchfit.policy.explore.throughput import assess
from batchfit.policy.explore.time_budget import TimeBudget
from batchfit.policy.noise.goodput import SAMPLE_TOLERANCE, ThroughputAt, goodput
from batchfit.policy.noise.noise_scale import NoiseScale
from batchfit.policy.plan.micro_batch import check_divisible, micro_batch_sizes
from batchfit.progress import Event, OnProgress, tell
from batchfit.runtime.devices.host import malloc_advice
from batchfit.runtime.distributed.lockstep import ranks
from batchfit.runtime.steps.timer import StepTimer
from batchfit.runtime.workloads.entry import check_entry
from batchfit.runtime.workloads.workload import Workload, check_model_on
from batchfit.search.find_batch_size import find_on
from batchfit.where import ResolvedDevice, WhereShorthand, target_of


def explore(
    workload: Workload,
    *,
    where: Where | None = None,
    sizes: BatchSizes = BatchSizes(),
    timing: Timing = Timing(),
    goal: Goal = Goal(),
    on_progress: OnProgress | None = None,
    **shorthand: Unpack[WhereShorthand],
) -> ExploreResult:
    """Measure training throughput against batch size and recommend one.

    The bound is ``sizes.max_batch_size`` or, when not given, the memory-safe maximum that
    ``find_batch_size`` finds at ``memory_fraction``. The batch sizes timed, the rounds and the
    stop follow ``batchfit.policy.explore.exploration`` (see docs/explore.md): the recommendation is the
    smallest batch within ``goal.tolerance`` of the fastest that reaches
    ``goal.confidence_target``, or the fastest with ``goal.objective="max-throughput"``. A window
    is ``timing.steps_per_window`` steps or, when None, the fewest that last 20 ms. With
    ``sizes.global_batch_size``, the micro-batch must divide ``global_batch_size / world_size``
    (the ranks of the process group when None, else 1); with ``multiple_of``, be a multiple of it.
    ``on_progress`` hears the memory search's trials, each new recommendation, a note before each
    visit to a batch size (the phase, the size, the time left), and on the CPU a note on glibc's
    malloc. ``timing.time_budget_seconds`` bounds the whole call; what it left out is the result's
    ``not_measured``. Under torch.distributed every rank runs it together and gets the same
    result. With ``goal.noise_scale`` the result's ``goodput`` predicts each batch to a target
    (``with_goodput``; docs/goodput.md).
    ``where`` says where to measure (a ``batchfit.Where``); ``device``, ``memory_limit`` and
    ``memory_fraction`` are its shorthand for the one-line call (one that disagrees with
    ``where`` is a ConfigurationError).
    """
    given = {"sizes": (sizes, BatchSizes), "timing": (timing, Timing), "goal": (goal, Goal)}
    check_entry("explore", workload, on_progress, **given)
    target = target_of("explore", where, shorthand)
    return explore_on(target, workload, sizes, timing, goal, on_progress)


def _checked_rules(sizes: BatchSizes, timing: Timing, goal: Goal, world_size: int) -> Rules:
    """explore's rounds' rules from the options, each request checked against the others."""
    rules = Rules(
        tolerance=goal.tolerance,
        objective=goal.objective,
        base_batch_size=goal.base_batch_size,
        confidence_target=goal.confidence_target,
        windows=timing.windows,
        time_budget_seconds=timing.time_budget_seconds,
    )
    rules.check()
    check_divisible(sizes.global_batch_size, world_size)
    if goal.noise_scale is not None and sizes.global_batch_size is not None:
        raise ConfigurationError(
            f"noise_scale weighs the batch of an optimizer step against its steps, and "
            f"global_batch_size={sizes.global_batch_size} fixes that batch: every micro-batch explored "
            f"trains it, and the fastest is the quickest to a target. Leave out one of the two."
        )
    return rules


def explore_on(
    target: ResolvedDevice,
    workload: Workload,
    sizes: BatchSizes = BatchSizes(),
    timing: Timing = Timing(),
    goal: Goal = Goal(),
    on_progress: OnProgress | None = None,
    budget: TimeBudget | None = None,
) -> ExploreResult:
    """``explore`` on a resolved target (compare explores each technique on its own). ``budget``:
    the part of an outer verb's time budget explore may take, on ``time.perf_counter`` (the step
    timer's clock; default: ``timing``'s, from now)."""
    budget = budget or TimeBudget(timing.time_budget_seconds)
    team = ranks()  # under torch.distributed every rank times the same windows
    world_size = sizes.world_size or team.world_size
    rules = _checked_rules(sizes, timing, goal, world_size)  # before any work is done
    rules = replace(rules, time_budget_seconds=budget.seconds)
    device = target.device
    # A rank whose model is elsewhere stops every rank, not only itself.
    team.run(lambda: check_model_on(workload.module, device.torch_device))
    max_batch_size, candidates = _candidates(target, workload, sizes, world_size, on_progress)
    advice = malloc_advice() if device.torch_device.type == "cpu" else None
    if advice:
        tell(on_progress, Event("explore", "note", message=advice))
    tokens_per_sample = timing.tokens_per_sample or workload.tokens_per_sample

    def update(recommendation: Recommendation) -> None:
        tell(on_progress, Event("explore", "recommendation", "train", recommendation=recommendation))

    def note(message: str) -> None:
        tell(on_progress, Event("explore", "note", "train", message=message))

    with StepTimer(workload, device, timing.steps_per_window, tokens_per_sample) as timer:
        started = team.shared(lambda: budget.started)  # the time budget on rank 0's clock
        meter = team.meter(timer)
        exploration = explore_rounds(
            candidates, meter, rules, started=started, on_update=update, on_note=note
        )
    result = ExploreResult(
        exploration.points,
        exploration.recommendation,
        exploration.history,
        max_batch_size,
        "tokens/s" if tokens_per_sample else "samples/s",
        exploration.stop_reason,
        exploration.seconds,
        str(device.torch_device),
        exploration.unsettled,
        not_measured=exploration.not_measured,
        timing_seconds=exploration.timing_seconds,
        readings=exploration.readings,
    )
    if goal.noise_scale is None:
        return result
    return with_goodput(
        result, goal.noise_scale, sample_tolerance=goal.sample_tolerance, world_size=world_size
    )


def _candidates(
    target: ResolvedDevice,
    workload: Workload,
    sizes: BatchSizes,
    world_size: int,
    on_progress: OnProgress | None,
) -> tuple[int, list[int]]:
    """The largest batch explored (``sizes.max_batch_size``, else the memory search's answer) and
    the sizes explore may time up to it."""
    max_batch_size = sizes.max_batch_size
    if max_batch_size is None:
        searched = replace(sizes, global_batch_size=None, world_size=None)
        max_batch_size = find_on(target, workload, "train", searched, on_progress=on_progress).batch_size
    candidates = micro_batch_sizes(
        sizes.min_batch_size,
        max_batch_size,
        multiple_of=sizes.multiple_of,
        global_batch_size=sizes.global_batch_size,
        world_size=world_size,
    )
    return max_batch_size, list(candidates)


def with_goodput(
    result: ExploreResult,
    noise_scale: NoiseScale | float,
    *,
    sample_tolerance: float = SAMPLE_TOLERANCE,
    world_size: int = 1,
) -> ExploreResult:
    """``result`` with its ``goodput`` at ``noise_scale`` (a measured ``NoiseScale`` or a number of
    samples): each measured batch's drift-corrected throughput, with its error, predicted to a target
    (``batchfit.policy.noise.goodput``). ``world_size``: an optimizer step trains each batch size times it."""
    levels, errors = assess([point for point in result.points if point.samples_per_second])
    measured = [
        ThroughputAt(size, level, None if errors is None else errors[size])
        for size, level in levels.items()
        if level > 0  # a size nothing got through trains nothing
    ]
    analysis = goodput(
        measured, noise_scale, sample_tolerance=sample_tolerance, world_size=world_size, unit=result.unit
    )
    return replace(result, goodput=analysis)

"""``explore``: training throughput against batch size, up to the memory-safe maximum, with a
live recommendation that settles as evidence comes in. The decisions are the policy's
(``batchfit.policy.exploration``); this module times real steps for it and reports."""

from __future__ import annotations

import csv
import io
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from batchfit.checks import check_batch_range, check_positive_int
from batchfit.find import find_on
from batchfit.policy.choose import Objective, Point, Recommendation, estimates
from batchfit.policy.exploration import Meter, Rules, StopReason, explore_rounds
from batchfit.policy.micro_batch import check_divisible, micro_batch_sizes
from batchfit.policy.trial import Trial
from batchfit.runtime.devices.resolve import resolve_device
from batchfit.runtime.distributed.lockstep import Lockstep, LockstepMeter
from batchfit.runtime.steps.timer import StepTimer
from batchfit.runtime.workloads.workload import Workload, check_model_on


@dataclass(frozen=True)
class ExploreResult:
    """Every measured point (all its windows), the recommendation, and how it got there."""

    points: tuple[Point, ...]
    recommendation: Recommendation
    history: tuple[Recommendation, ...]  # the live recommendation after each measurement
    max_batch_size: int  # the memory-safe bound explored up to
    unit: str  # "samples/s" or "tokens/s"
    stop_reason: StopReason
    explore_seconds: float

    def estimates(self) -> dict[int, float]:
        """Each batch size's throughput with the rounds' drift divided out (what the rule compares)."""
        return estimates(self.points)

    def to_dict(self) -> dict[str, Any]:
        corrected = self.estimates()
        return {
            "points": [{**point.to_dict(), "estimate": corrected[point.batch_size]} for point in self.points],
            "recommendation": self.recommendation.to_dict(),
            "history": [entry.to_dict() for entry in self.history],
            "max_batch_size": self.max_batch_size,
            "unit": self.unit,
            "stop_reason": self.stop_reason,
            "explore_seconds": self.explore_seconds,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"

    def to_csv(self) -> str:
        buffer = io.StringIO()
        writer = csv.writer(buffer)
        writer.writerow(["batch_size", f"estimate_{self.unit}", f"median_{self.unit}", "spread", "windows"])
        corrected = self.estimates()
        for point in self.points:
            writer.writerow(
                [
                    point.batch_size,
                    f"{corrected[point.batch_size]:.3f}",
                    f"{point.median:.3f}",
                    f"{point.spread:.4f}",
                    len(point.samples_per_second),
                ]
            )
        return buffer.getvalue()

    def table(self) -> str:
        corrected = self.estimates()
        lines = [f"{'batch_size':>10}  {self.unit:>12}  {'raw median':>12}  {'spread':>7}  {'windows':>7}"]
        for point in self.points:
            mark = "  <- recommended" if point.batch_size == self.recommendation.batch_size else ""
            lines.append(
                f"{point.batch_size:>10}  {corrected[point.batch_size]:>12.1f}  {point.median:>12.1f}  "
                f"{point.spread:>6.1%}  "
                f"{len(point.samples_per_second):>7}{mark}"
            )
        lines.append(self.recommendation.line())
        return "\n".join(lines) + "\n"


def explore(
    workload: Workload,
    *,
    device: str | torch.device | None = None,
    memory_limit: str | int | None = None,
    memory_fraction: float = 0.8,
    min_batch_size: int = 1,
    max_batch_size: int | None = None,
    tolerance: float = 0.03,
    objective: Objective = "smallest-within-tolerance",
    base_batch_size: int | None = None,
    world_size: int | None = None,
    global_batch_size: int | None = None,
    multiple_of: int | None = None,
    windows: int = 3,
    steps_per_window: int | None = None,
    time_budget_seconds: float | None = None,
    confidence_target: int = 90,
    tokens_per_sample: int | None = None,
    on_update: Callable[[Recommendation], None] | None = None,
    on_trial: Callable[[Trial], None] | None = None,
    on_trial_start: Callable[[int], None] | None = None,
) -> ExploreResult:
    """Measure training throughput against batch size and recommend one.

    The bound is ``max_batch_size`` or, when not given, the memory-safe maximum that
    ``find_batch_size`` finds at ``memory_fraction``. The batch sizes timed, the rounds and the
    stop follow ``batchfit.policy.exploration`` (see docs/explore.md): the recommendation is the
    smallest batch within ``tolerance`` of the fastest that reaches ``confidence_target``, or the
    fastest with ``objective="max-throughput"``; ``on_update`` hears each new recommendation, and
    ``on_trial_start`` / ``on_trial`` each trial of the search for the memory-safe maximum.
    A window is ``steps_per_window`` steps or, when None, the fewest that last 20 ms. With
    ``global_batch_size``, the micro-batch must divide ``global_batch_size / world_size`` (the
    ranks of the process group when None, else 1); with ``multiple_of``, be a multiple of it.
    Under torch.distributed every rank runs it together and gets the same result.
    """
    started = time.perf_counter()
    lockstep = Lockstep.current()  # under torch.distributed every rank times the same windows
    if world_size is None:
        world_size = 1 if lockstep is None else lockstep.world_size
    for name, value in (
        ("steps_per_window", steps_per_window),
        ("world_size", world_size),
        ("multiple_of", multiple_of),
        ("global_batch_size", global_batch_size),
    ):
        if value is not None:
            check_positive_int(name, value)
    check_batch_range(min_batch_size, min_batch_size if max_batch_size is None else max_batch_size)
    rules = Rules(
        tolerance=tolerance,
        objective=objective,
        base_batch_size=base_batch_size,
        confidence_target=confidence_target,
        windows=windows,
        time_budget_seconds=time_budget_seconds,
    )
    rules.check()
    check_divisible(global_batch_size, world_size)  # before any work is done
    target = resolve_device(device, memory_limit)
    if lockstep is None:
        check_model_on(workload.module, target.torch_device)
    else:  # a rank whose model is elsewhere stops every rank, not only itself
        lockstep.run(lambda: check_model_on(workload.module, target.torch_device))
    if max_batch_size is None:
        max_batch_size = find_on(
            target,
            workload,
            "train",
            memory_fraction=memory_fraction,
            min_batch_size=min_batch_size,
            multiple_of=multiple_of,
            on_trial=on_trial,
            on_trial_start=on_trial_start,
        ).batch_size
    candidates = micro_batch_sizes(
        min_batch_size,
        max_batch_size,
        multiple_of=multiple_of,
        global_batch_size=global_batch_size,
        world_size=world_size,
    )
    tokens_per_sample = tokens_per_sample or workload.tokens_per_sample
    with StepTimer(workload, target, steps_per_window, tokens_per_sample) as timer:
        meter: Meter = timer
        if lockstep is not None:
            meter = LockstepMeter(timer, lockstep)
            started = lockstep.shared(lambda: started)  # the time budget on rank 0's clock
        exploration = explore_rounds(candidates, meter, rules, started=started, on_update=on_update)
    return ExploreResult(
        exploration.points,
        exploration.recommendation,
        exploration.history,
        max_batch_size,
        "tokens/s" if tokens_per_sample else "samples/s",
        exploration.stop_reason,
        exploration.seconds,
    )

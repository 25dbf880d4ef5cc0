"""``explore``: training throughput against batch size, up to the memory-safe maximum, with a
live recommendation that settles as evidence comes in."""

from __future__ import annotations

import csv
import io
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch

from batchfit.choose import Objective, Point, Recommendation, recommend
from batchfit.device import Device, resolve_device
from batchfit.errors import ConfigurationError
from batchfit.find import find_batch_size
from batchfit.state import TrainingSnapshot
from batchfit.workload import Workload, to_device

StopReason = Literal["confident", "time_budget", "exhausted"]
#: New batch sizes measured around the recommendation after the coarse pass, and rounds of extra
#: windows for the contenders, before the exploration stops unsettled ("exhausted").
MAX_REFINEMENTS = 4
MAX_EXTRA_ROUNDS = 3


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

    def to_dict(self) -> dict[str, Any]:
        return {
            "points": [point.to_dict() for point in self.points],
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
        writer.writerow(["batch_size", f"median_{self.unit}", "spread", "windows"])
        for point in self.points:
            writer.writerow(
                [
                    point.batch_size,
                    f"{point.median:.3f}",
                    f"{point.spread:.4f}",
                    len(point.samples_per_second),
                ]
            )
        return buffer.getvalue()

    def table(self) -> str:
        lines = [f"{'batch_size':>10}  {self.unit:>12}  {'spread':>7}  {'windows':>7}"]
        for point in self.points:
            mark = "  <- recommended" if point.batch_size == self.recommendation.batch_size else ""
            lines.append(
                f"{point.batch_size:>10}  {point.median:>12.1f}  {point.spread:>6.1%}  "
                f"{len(point.samples_per_second):>7}{mark}"
            )
        lines.append(self.recommendation.line())
        return "\n".join(lines) + "\n"


def explore(
    workload: Workload,
    *,
    device: str | torch.device | None = None,
    memory_limit: str | int | None = None,
    fraction: float = 0.8,
    min_batch: int = 1,
    max_batch: int | None = None,
    tolerance: float = 0.03,
    objective: Objective = "smallest-within-tolerance",
    base_batch: int | None = None,
    world_size: int = 1,
    global_batch: int | None = None,
    multiple_of: int | None = None,
    windows: int = 5,
    steps_per_window: int = 3,
    time_budget: float | None = None,
    confidence_target: int = 90,
    tokens_per_sample: int | None = None,
    on_update: Callable[[Recommendation], None] | None = None,
) -> ExploreResult:
    """Measure training throughput against batch size and recommend one.

    The bound is ``max_batch`` or, when not given, the memory-safe maximum ``find_batch_size``
    finds at ``fraction``. Batch sizes are measured coarsely (powers of two and the bound), then
    refined around the recommendation, until its confidence reaches ``confidence_target`` or
    ``time_budget`` seconds run out. With ``world_size`` and ``global_batch``, the micro-batch must
    divide ``global_batch / world_size``; with ``multiple_of``, be a multiple of it.
    """
    started = time.perf_counter()
    for name, value in (
        ("windows", windows),
        ("steps_per_window", steps_per_window),
        ("world_size", world_size),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigurationError(f"{name} must be a positive integer, got {value!r}.")
    if windows < 2:
        raise ConfigurationError(f"windows must be at least 2 (one is discarded as warm-up), got {windows}.")
    if global_batch is not None and global_batch % world_size:
        raise ConfigurationError(
            f"global_batch ({global_batch}) is not divisible by world_size ({world_size}); "
            f"{global_batch // world_size * world_size or world_size} or "
            f"{(global_batch // world_size + 1) * world_size} would work."
        )
    if max_batch is None:
        max_batch = find_batch_size(
            workload,
            "train",
            device=device,
            memory_limit=memory_limit,
            fraction=fraction,
            min_batch=min_batch,
            multiple_of=multiple_of,
        ).batch_size
    target = resolve_device(device, memory_limit)

    def allowed(batch: int) -> bool:
        if not min_batch <= batch <= max_batch or (multiple_of and batch % multiple_of):
            return False
        return global_batch is None or (global_batch // world_size) % batch == 0

    candidates = [batch for batch in range(min_batch, max_batch + 1) if allowed(batch)]
    if not candidates:
        raise ConfigurationError(
            f"no micro-batch in [{min_batch}, {max_batch}] satisfies the constraints "
            f"(multiple_of={multiple_of}, global_batch={global_batch}, world_size={world_size})."
        )
    tokens_per_sample = tokens_per_sample or workload.tokens_per_sample
    meter = _Meter(workload, target, steps_per_window, tokens_per_sample)
    measured: dict[int, list[float]] = {}
    history: list[Recommendation] = []

    def points() -> list[Point]:
        return [Point(batch, tuple(values)) for batch, values in sorted(measured.items())]

    def measure(batch: int, count: int) -> None:
        measured.setdefault(batch, []).extend(meter.windows(batch, count))
        current = recommend(points(), tolerance=tolerance, objective=objective, base_batch_size=base_batch)
        if current is not None:
            history.append(current)
            if on_update is not None:
                on_update(current)

    def out_of_time() -> bool:
        return time_budget is not None and time.perf_counter() - started > time_budget

    coarse = _coarse(candidates, base_batch)
    reason: StopReason = "exhausted"
    try:
        for batch in coarse:
            if history and out_of_time():  # the first point is always measured
                reason = "time_budget"
                break
            measure(batch, windows)
        rounds = refinements = 0
        while reason != "time_budget":
            current = history[-1]
            gap = _refinement(candidates, sorted(measured), current.batch_size)
            if out_of_time():
                reason = "time_budget"
            elif gap is not None and refinements < MAX_REFINEMENTS:
                refinements += 1
                measure(gap, windows)
            elif current.confidence >= confidence_target:
                reason = "confident"
                break
            elif rounds >= MAX_EXTRA_ROUNDS:
                break
            else:  # more evidence where the decision is made
                rounds += 1
                for batch in {current.batch_size, current.best_batch_size}:
                    measure(batch, windows)
    finally:
        meter.close()
    return ExploreResult(
        tuple(points()),
        history[-1],
        tuple(history),
        max_batch,
        "tokens/s" if tokens_per_sample else "samples/s",
        reason,
        time.perf_counter() - started,
    )


def _coarse(candidates: list[int], base_batch: int | None) -> list[int]:
    """Powers of two across the candidates (the nearest allowed to each), the bound, and the base."""
    chosen = {candidates[0], candidates[-1]}
    power = 1
    while power <= candidates[-1]:
        chosen.add(min(candidates, key=lambda batch: (abs(math.log2(batch / power)), batch)))
        power *= 2
    if base_batch is not None and base_batch in candidates:
        chosen.add(base_batch)
    return sorted(chosen)


def _refinement(candidates: list[int], measured: list[int], recommended: int) -> int | None:
    """An unmeasured candidate halfway between the recommendation and a measured neighbour."""
    index = measured.index(recommended)
    for neighbour in (
        measured[index + 1] if index + 1 < len(measured) else None,
        measured[index - 1] if index > 0 else None,
    ):
        if neighbour is None:
            continue
        low, high = sorted((recommended, neighbour))
        between = [batch for batch in candidates if low < batch < high]
        if between:
            middle = math.sqrt(low * high)
            return min(between, key=lambda batch: abs(batch - middle))
    return None


class _Meter:
    """Times training windows at a batch size, restoring the model and optimizer afterwards."""

    def __init__(self, workload: Workload, device: Device, steps: int, tokens_per_sample: int | None) -> None:
        self.workload, self.device, self.steps = workload, device, steps
        self.tokens = tokens_per_sample or 1
        optimizer = workload.optimizer if isinstance(workload.optimizer, torch.optim.Optimizer) else None
        self.snapshot = TrainingSnapshot.capture(workload.model, optimizer)
        self.snapshot.set_gradients_aside()

    def windows(self, batch_size: int, count: int) -> list[float]:
        """``count`` windows of throughput at ``batch_size``, after a warm-up step and a discarded window."""
        workload = self.workload
        host_batch = workload.host_batch(batch_size)
        optimizer = workload.build_optimizer()
        workload.model.train()
        rates = []
        try:
            self._steps(host_batch, optimizer, 1)  # a warm-up step for this shape
            self._steps(host_batch, optimizer, self.steps)  # the first window is discarded
            for _ in range(count):
                begin = time.perf_counter()
                self._steps(host_batch, optimizer, self.steps)
                rates.append(batch_size * self.tokens * self.steps / (time.perf_counter() - begin))
        finally:
            self.snapshot.restore(gradients=False)
        return rates

    def _steps(self, host_batch: Any, optimizer: torch.optim.Optimizer | None, count: int) -> None:
        self.device.synchronize()
        for _ in range(count):
            self.workload.run_train_step(optimizer, to_device(host_batch, self.device.torch_device))
        self.device.synchronize()

    def close(self) -> None:
        self.snapshot.restore(gradients=True)
        self.device.release()

"""``explore``: training throughput against batch size, up to the memory-safe maximum, with a
live recommendation that settles as evidence comes in."""

from __future__ import annotations

import csv
import io
import json
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Literal

import torch

from batchfit.choose import Objective, Point, Recommendation, confidences, estimates, recommend
from batchfit.device import Device, resolve_device
from batchfit.errors import ConfigurationError
from batchfit.find import find_batch_size
from batchfit.state import TrainingSnapshot
from batchfit.workload import Workload, to_device

StopReason = Literal["confident", "time_budget", "exhausted"]
#: Batch sizes added between the recommendation and its measured neighbours after the coarse
#: pass, and rounds over the contenders after it, before the exploration stops unsettled.
MAX_REFINEMENTS = 2
MAX_FOCUS_ROUNDS = 16
#: ... and the rounds stop once they have taken this many times as long as the coarse pass (what a
#: look over the whole range costs on this model and machine).
FOCUS_TIME_FACTOR = 1.5
#: A size at least this likely to be within the tolerance of the best stays in the rounds.
KEEP_CHANCE = 0.2
#: The exploration stops confident once the confidence has reached its target after this many
#: rounds in a row: checked after every round, a single crossing is too often a lucky one
#: (measured: 5 of 12 such stops in runs of the benchmark missed 97% of the best, at confidence 90-96).
SETTLED_ROUNDS = 2
#: In the coarse pass (largest first), a size whose first window reads below this share of the
#: fastest so far gets no more windows: far from any tolerance, it only sets the scale.
FAR_BELOW = 0.8
#: Training steps between two restores of the weights during the exploration.
RESTORE_EVERY = 32
#: With ``steps_per_window=None``, a window is the fewest steps that last at least this long.
MIN_WINDOW_SECONDS = 0.02


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
    fraction: float = 0.8,
    min_batch: int = 1,
    max_batch: int | None = None,
    tolerance: float = 0.03,
    objective: Objective = "smallest-within-tolerance",
    base_batch: int | None = None,
    world_size: int = 1,
    global_batch: int | None = None,
    multiple_of: int | None = None,
    windows: int = 3,
    steps_per_window: int | None = None,
    time_budget: float | None = None,
    confidence_target: int = 90,
    tokens_per_sample: int | None = None,
    on_update: Callable[[Recommendation], None] | None = None,
) -> ExploreResult:
    """Measure training throughput against batch size and recommend one.

    The bound is ``max_batch`` or, when not given, the memory-safe maximum ``find_batch_size``
    finds at ``fraction``. Each batch size gets a warm-up step and a discarded first window. A
    coarse pass measures the powers of two, the bound and the base, from the largest down,
    ``windows`` windows each in a row, or one for a size whose first reads below ``FAR_BELOW`` of
    the fastest before it (far from any tolerance, it only sets the scale). Then the contenders
    (the recommendation and the batch size below it, the fastest and the one above it, and any size
    at least ``KEEP_CHANCE`` likely to be within the tolerance) are measured in rounds, one window
    each per round after one untimed step (the first step after another shape runs slower), so that
    a slow spell on the machine hits them alike and the chooser can divide each round's common
    factor out. After the first round, up to ``MAX_REFINEMENTS`` batch sizes are added between the
    recommendation and its neighbour, and a size seen only in the coarse pass that reads slower
    than both neighbours joins a round. It stops when the confidence has reached
    ``confidence_target`` after ``SETTLED_ROUNDS`` rounds in a row, when ``time_budget`` seconds
    run out, or after ``MAX_FOCUS_ROUNDS`` rounds or ``FOCUS_TIME_FACTOR`` times the coarse pass's
    time. A window is ``steps_per_window`` steps or, when None, the fewest steps that last
    ``MIN_WINDOW_SECONDS``. With ``world_size`` and ``global_batch``, the micro-batch must divide
    ``global_batch / world_size``; with ``multiple_of``, be a multiple of it.
    """
    started = time.perf_counter()
    for name, value in (
        ("windows", windows),
        ("steps_per_window", 1 if steps_per_window is None else steps_per_window),
        ("world_size", world_size),
        ("min_batch", min_batch),
        ("max_batch", 1 if max_batch is None else max_batch),
        ("multiple_of", 1 if multiple_of is None else multiple_of),
        ("global_batch", 1 if global_batch is None else global_batch),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigurationError(f"{name} must be a positive integer, got {value!r}.")
    if windows < 2:
        raise ConfigurationError(f"windows must be at least 2 (a spread needs two), got {windows}.")
    if max_batch is not None and min_batch > max_batch:
        raise ConfigurationError(
            f"min_batch ({min_batch}) is larger than max_batch ({max_batch}); pass min_batch <= max_batch."
        )
    # The chooser's own checks (tolerance, objective, confidence target), before any work is done.
    recommend((), tolerance=tolerance, objective=objective, confidence_target=confidence_target)
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
        constraints = [f"multiple_of={multiple_of}"] if multiple_of else []
        if global_batch is not None:
            constraints.append(f"global_batch={global_batch} / world_size={world_size}")
        raise ConfigurationError(
            f"no micro-batch in [{min_batch}, {max_batch}] satisfies {' and '.join(constraints)}; "
            f"loosen one or widen the range."
        )
    tokens_per_sample = tokens_per_sample or workload.tokens_per_sample
    meter = _Meter(workload, target, steps_per_window, tokens_per_sample)
    measured: dict[int, list[tuple[int, float]]] = {}  # batch size -> (round, throughput) per window
    history: list[Recommendation] = []
    far: set[int] = set()  # sizes measured once in the coarse pass, being far slower than the fastest
    rounds = 0

    def points() -> list[Point]:
        return [
            Point(batch, tuple(rate for _, rate in windows_), tuple(r for r, _ in windows_))
            for batch, windows_ in sorted(measured.items())
            if windows_
        ]

    def out_of_time() -> bool:
        return time_budget is not None and time.perf_counter() - started > time_budget

    def update(finished: bool, covered: bool = True) -> None:
        current = recommend(
            points(),
            tolerance=tolerance,
            objective=objective,
            base_batch_size=base_batch,
            confidence_target=confidence_target,
        )
        if current is not None and not covered:  # the best may lie in what is not measured yet
            current = replace(current, confidence=0)
        if current is not None and (not history or current != history[-1] or finished):
            history.append(current)
            if on_update is not None:
                on_update(current)

    def visit(batch: int, count: int, floor: float = 0.0) -> bool:
        """``count`` windows at ``batch`` in the current round (a warm-up and a discarded window
        on the first visit, one untimed step on the later ones: the first step after another
        shape runs slower), or one when the first reads below ``floor``; False when the time
        budget ran out before."""
        if measured and out_of_time():  # the first window is always measured
            return False
        if batch not in measured:
            meter.warm_up(batch)
            measured[batch] = []
        else:
            meter.rewarm(batch)
        for index in range(count):
            measured[batch].append((rounds, meter.window(batch)))
            if index == 0 and measured[batch][-1][1] < floor:
                far.add(batch)
                break
        return True

    def coarse_pass(batches: list[int]) -> bool:
        """Each batch size on its own, from the largest down, ``windows`` windows in a row, or
        one for a size whose first reads below ``FAR_BELOW`` of the fastest so far."""
        nonlocal rounds
        fastest = 0.0
        for batch in reversed(batches):
            finished = visit(batch, windows, FAR_BELOW * fastest)
            meter.reset()
            rounds += 1
            update(finished, covered=batch == batches[0])
            if not finished:
                return False
            fastest = max(fastest, statistics.median(rate for _, rate in measured[batch]))
        return True

    def run_round(batches: set[int]) -> bool:
        """One window per batch size, in alternating order (a drift within the round hits both
        ends alike), so the chooser can divide the round's common factor out."""
        nonlocal rounds
        finished = all(visit(batch, 1) for batch in sorted(batches, reverse=rounds % 2 == 1))
        meter.reset()
        rounds += 1
        update(finished)
        return finished

    reason: StopReason = "exhausted"
    try:
        coarse_started = time.perf_counter()
        if not coarse_pass(_coarse(candidates, base_batch)):
            reason = "time_budget"
        focus_ends = time.perf_counter() + FOCUS_TIME_FACTOR * (time.perf_counter() - coarse_started)
        refinements = focus_rounds = settled = 0
        while reason != "time_budget":
            current = history[-1]
            fresh = {batch for batch, values in measured.items() if len(values) < windows}
            fresh = (fresh | _lone_dips(points())) - far
            gap = _refinement(candidates, sorted(measured), current.batch_size, objective)
            if out_of_time():
                reason = "time_budget"
                break
            # Refine, or stop confident, only once the coarse answer has been compared with the
            # fastest in a round: a slow spell during the coarse pass must not decide either.
            refine = gap is not None and refinements < MAX_REFINEMENTS and focus_rounds > 0
            sure = not refine and focus_rounds > 0 and not fresh and current.confidence >= confidence_target
            settled = settled + 1 if sure else 0
            if refine:
                assert gap is not None
                refinements += 1
                fresh.add(gap)
            elif settled >= SETTLED_ROUNDS:
                reason = "confident"
                break
            # A sure answer gets the round that confirms it even at the caps (one round more).
            elif not sure and (focus_rounds >= MAX_FOCUS_ROUNDS or time.perf_counter() > focus_ends):
                break
            focus_rounds += 1
            chances = confidences(points(), tolerance=tolerance)
            if not run_round(_focus(sorted(measured), current, chances) | fresh):
                reason = "time_budget"
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


def _lone_dips(points: list[Point]) -> set[int]:
    """Batch sizes seen only in rounds of their own that read slower than both measured
    neighbours. Throughput curves rise, level off and may fall, but seldom dip and recover, so
    such a reading is more likely a slow spell than the batch size (measured: the transformer's
    32 read 0.84 of the best in the coarse pass, between 16 and 64 at 0.92, where a sweep put it
    at 0.99); it is compared in a round before the exploration stops confident."""
    owners: dict[int, set[int]] = {}
    for point in points:
        for r in point.rounds:
            owners.setdefault(r, set()).add(point.batch_size)
    lone = [
        point.batch_size
        for point in points
        if point.rounds and all(len(owners[r]) == 1 for r in point.rounds)
    ]
    level = estimates(points, pooled=False)  # a dip is what the size's own windows say
    sizes = sorted(level)
    dips = set()
    for batch in lone:
        index = sizes.index(batch)
        neighbours = [level[size] for size in sizes[max(index - 1, 0) : index + 2] if size != batch]
        if len(neighbours) == 2 and level[batch] < min(neighbours):
            dips.add(batch)
    return dips


def _focus(measured: list[int], current: Recommendation, chances: dict[int, float] | None = None) -> set[int]:
    """The contenders: the recommendation and the batch size measured just below it (the one the
    rule would take if it came within the tolerance), the fastest and the one just above it (which
    a slow spell during its first windows may have put behind), and any size whose chance of being
    within the tolerance of the best (``chances``) is ``KEEP_CHANCE`` or more: a size that was the
    fastest and is no longer next to the recommendation must still be compared with it in the same
    rounds (measured: the mlp's 512 left the rounds when 384 read fastest, and 384, at 0.91 of
    512, was recommended from rounds that no longer measured 512)."""
    chosen: set[int] = set()
    for batch, step in ((current.batch_size, -1), (current.best_batch_size, 1)):
        index = measured.index(batch)
        chosen.add(batch)
        if 0 <= index + step < len(measured):
            chosen.add(measured[index + step])
    return chosen | {batch for batch, chance in (chances or {}).items() if chance >= KEEP_CHANCE}


def _refinement(
    candidates: list[int], measured: list[int], recommended: int, objective: Objective
) -> int | None:
    """An unmeasured candidate between the recommendation and a measured neighbour (the roundest,
    then the nearest the geometric middle): below it for the smallest-within-tolerance rule
    (where the smallest such batch lies), on either side for max-throughput."""
    index = measured.index(recommended)
    neighbours = [measured[index - 1] if index > 0 else None]
    if objective == "max-throughput":
        neighbours.append(measured[index + 1] if index + 1 < len(measured) else None)
    for neighbour in neighbours:
        if neighbour is None:
            continue
        low, high = sorted((recommended, neighbour))
        between = [batch for batch in candidates if low < batch < high]
        if between:
            # The roundest size (most factors of two: 48 between 32 and 64, 12 between 8 and 16),
            # nearest the geometric middle: kernels tile by powers of two, and users want such sizes.
            middle = math.sqrt(low * high)
            return min(between, key=lambda batch: (-(batch & -batch), abs(batch - middle)))
    return None


class _Meter:
    """Times training windows at several batch sizes in turn, restoring the model and optimizer
    after every round and at the end."""

    def __init__(
        self, workload: Workload, device: Device, steps_per_window: int | None, tokens_per_sample: int | None
    ) -> None:
        self.workload, self.device, self.fixed_steps = workload, device, steps_per_window
        self.tokens = tokens_per_sample or 1
        optimizer = workload.optimizer if isinstance(workload.optimizer, torch.optim.Optimizer) else None
        self.snapshot = TrainingSnapshot.capture(workload.model, optimizer)
        self.snapshot.set_gradients_aside()
        self.optimizer = workload.build_optimizer()
        self.batches: dict[int, Any] = {}
        self.steps: dict[int, int] = {}
        self.unrestored_steps = 0

    def warm_up(self, batch_size: int) -> None:
        """A warm-up step for this shape, then a first window that is discarded; it also sets the
        window's length in steps (the fewest that last ``MIN_WINDOW_SECONDS``, unless fixed)."""
        self.workload.model.train()
        self.batches[batch_size] = self.workload.host_batch(batch_size)
        self._timed(batch_size, 1)
        first = self.fixed_steps or 1
        seconds = self._timed(batch_size, first)
        self.steps[batch_size] = self.fixed_steps or max(1, math.ceil(MIN_WINDOW_SECONDS * first / seconds))

    def rewarm(self, batch_size: int) -> None:
        """One untimed step, when coming back to this shape from another."""
        self._timed(batch_size, 1)

    def window(self, batch_size: int) -> float:
        """The throughput of one window at ``batch_size`` (after ``warm_up``)."""
        steps = self.steps[batch_size]
        return batch_size * self.tokens * steps / self._timed(batch_size, steps)

    def _timed(self, batch_size: int, count: int) -> float:
        host_batch = self.batches[batch_size]
        self.device.synchronize()
        begin = time.perf_counter()
        for _ in range(count):
            self.workload.run_train_step(self.optimizer, to_device(host_batch, self.device.torch_device))
        self.device.synchronize()
        self.unrestored_steps += count
        return max(time.perf_counter() - begin, 1e-9)

    def reset(self) -> None:
        """Put the weights back every ``RESTORE_EVERY`` steps or so: a long exploration must not
        train the model into another regime (a restore copies every weight and optimizer state,
        too costly after each window of a small model)."""
        if self.unrestored_steps >= RESTORE_EVERY:
            self.snapshot.restore(gradients=False)
            self.unrestored_steps = 0

    def close(self) -> None:
        self.batches.clear()
        self.snapshot.restore(gradients=True)
        self.device.release()

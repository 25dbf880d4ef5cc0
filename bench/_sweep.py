"""The explore benchmark's truth: an exhaustive throughput sweep measured in passes over the batch
sizes, the median polish that divides each pass's drift out, and the statistics read from it."""

from __future__ import annotations

import math
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import _workloads
import torch
from _harness import Stopwatch

from batchfit.runtime.devices.resolve import resolve_device
from batchfit.runtime.steps.timer import StepTimer

STEPS_PER_WINDOW = 3  # batchfit's default steps_per_window
SWEEP_WINDOWS = 9  # the sweep whose time batchfit's is compared with
RULE_TOLERANCE = 0.03  # the truth's pick: the smallest within this share of the best (explore's default)
TRUTH_WINDOWS = 21  # the truth's windows: the sweep's and more, not counted in its time
QUICK_SWEEP_WINDOWS = 5
QUICK_TRUTH_WINDOWS = 9
#: After the passes over every size, the contenders (within this of the best median, and
#: batchfit's pick) get passes of their own: a median of 21 noisy windows is still about as
#: uncertain as the 3% tolerance being judged.
CONTENDER_MARGIN = 0.06


@dataclass(frozen=True)
class Sharpen:
    windows: int  # a contender's windows in all, the passes over every size included
    seconds: float  # the most time the contenders' own passes may take, per example


SHARPEN = Sharpen(windows=101, seconds=300.0)
#: On CUDA a window's throughput varies far less than on a shared CPU, and ResNet-50's full
#: sharpening (about 300 s) does not fit a 10-minute device call beside the sweep and explore.
CUDA_SHARPEN = Sharpen(windows=41, seconds=60.0)
QUICK_SHARPEN = Sharpen(windows=15, seconds=20.0)


@dataclass
class SweepPoint:
    batch_size: int
    windows: list[float]  # throughput of each window (samples/s, or tokens/s for the transformer)
    passes: list[int]  # the pass each window was measured in
    median: float  # the plain median of the windows
    level: float  # the throughput with each pass's common factor divided out (see ``polish``)
    seconds: float  # time of this point's warm-up and counted windows


@dataclass
class Sweep:
    points: dict[int, SweepPoint]  # the sweep's batch sizes (the truth)
    seconds: float  # time of the sweep's sizes' warm-ups and counted windows
    cpu_seconds: float
    extra: dict[int, SweepPoint]  # recommendations that are not sweep points, measured alike
    sharpened: list[int]  # the contenders given more windows after the passes over every size
    sharpen_seconds: float  # how long those further passes took (not counted in ``seconds``)

    @property
    def best_batch_size(self) -> int:
        return max(self.points, key=lambda batch: self.points[batch].level)

    @property
    def best(self) -> float:
        return self.points[self.best_batch_size].level

    def point(self, batch: int) -> SweepPoint:
        return self.points.get(batch) or self.extra[batch]


def sweep_sizes(max_batch_size: int) -> list[int]:
    """Powers of two and the midpoints between consecutive powers, up to and with ``max_batch_size``."""
    sizes = {max_batch_size}
    power = 1
    while power <= max_batch_size:
        sizes.add(power)
        if power >= 2 and power * 3 // 2 <= max_batch_size:
            sizes.add(power * 3 // 2)
        power *= 2
    return sorted(sizes)


Table = dict[int, dict[int, float]]  # batch size -> pass -> log-throughput of its window


def table_of(
    rates: dict[int, list[float]], passes: dict[int, list[int]], keep: Callable[[int], bool] | None = None
) -> Table:
    """The log-throughputs by batch size and pass (only the passes ``keep`` accepts, if given)."""
    return {
        batch: {p: math.log(v) for p, v in zip(passes[batch], values, strict=True) if keep is None or keep(p)}
        for batch, values in rates.items()
    }


def polish(table: Table, sweeps: int = 8) -> tuple[dict[int, float], dict[int, float]]:
    """Tukey's median polish of ``table``: log-throughput = level of the batch size + effect of
    the pass + residual. A pass's effect is what slowed or sped up every size measured in it (the
    machine's drift over the few seconds a pass takes), so levels are comparable between sizes
    measured in different passes: the contenders' own passes may run in a slower spell than the
    passes over every size did. Returns the levels (log) and the pass effects (centred on the
    typical pass)."""
    passes = sorted({p for row in table.values() for p in row})
    level = {batch: statistics.median(row.values()) for batch, row in table.items()}
    effect = dict.fromkeys(passes, 0.0)
    for _ in range(sweeps):
        for p in passes:
            effect[p] = statistics.median(row[p] - level[batch] for batch, row in table.items() if p in row)
        centre = statistics.median(effect.values())
        effect = {p: value - centre for p, value in effect.items()}
        level = {
            batch: statistics.median(v - effect[p] for p, v in row.items()) for batch, row in table.items()
        }
    return level, effect


def step_timer(example: str, device: torch.device, steps_per_window: int) -> StepTimer:
    """batchfit's own meter on a freshly built workload: what the sweep times windows with."""
    workload = _workloads.build(example, device)
    return StepTimer(workload, resolve_device(device, None), steps_per_window, workload.tokens_per_sample)


@dataclass
class _Windows:
    """Each size's timed windows and the pass each came from, and the seconds its first ``counted``
    passes took (the sweep's own time)."""

    timer: StepTimer
    counted: int
    rates: dict[int, list[float]]
    passes: dict[int, list[int]]
    seconds: dict[int, float]

    @classmethod
    def of(cls, timer: StepTimer, counted: int, sizes: list[int]) -> _Windows:
        return cls(timer, counted, {b: [] for b in sizes}, {b: [] for b in sizes}, dict.fromkeys(sizes, 0.0))

    def one_pass(self, batches: list[int], round_: int) -> None:
        """A window of each of ``batches``, upwards on even passes and downwards on odd ones."""
        for batch in sorted(batches, reverse=round_ % 2 == 1):
            if round_ > 0:
                # The first step after another shape runs slower: one untimed step puts the
                # size back in its steady state. A sweep of one size at a time would not
                # need it, so it is not counted.
                self.timer.revisit(batch)
            begin = time.perf_counter()
            if round_ == 0:
                self.timer.first_visit(batch)  # a warm-up step and a discarded first window
            self.rates[batch].append(self.timer.window(batch))
            self.passes[batch].append(round_)
            if round_ < self.counted:
                self.seconds[batch] += time.perf_counter() - begin
        self.timer.end_round()

    def contenders(self, sizes: list[int], extra: list[int]) -> list[int]:
        """The sizes within ``CONTENDER_MARGIN`` of the best level, at least the top three, and ``extra``."""
        level, _ = polish(table_of(self.rates, self.passes))
        ranked = sorted(sizes, key=level.__getitem__, reverse=True)
        floor = level[ranked[0]] + math.log(1 - CONTENDER_MARGIN)
        # At least three: a size measured in passes of its own would carry their drift alone.
        return sorted({*ranked[:3], *extra, *(batch for batch in sizes if level[batch] >= floor)})

    def points(self) -> dict[int, SweepPoint]:
        level, _ = polish(table_of(self.rates, self.passes))
        return {
            batch: SweepPoint(
                batch,
                self.rates[batch],
                self.passes[batch],
                statistics.median(self.rates[batch]),
                math.exp(level[batch]),
                self.seconds[batch],
            )
            for batch in self.rates
        }


def run_sweep(
    example: str,
    device: torch.device,
    max_batch_size: int,
    counted: int,
    windows: int,
    extra: list[int],
    sharpen: Sharpen,
) -> Sweep:
    """The truth: every sweep size (and the ``extra`` ones) measured in turn, one window each per
    pass, ``windows`` passes; then the contenders (within ``CONTENDER_MARGIN`` of the best median,
    and the ``extra`` sizes) more passes of their own, up to ``sharpen.windows`` windows each or
    ``sharpen.seconds`` of passes. The sweep's time is what its sizes' warm-ups and first
    ``counted`` windows took: the further windows only sharpen the truth, and the extra sizes
    are not the sweep's."""
    sizes = sweep_sizes(max_batch_size)
    everything = sorted(set(sizes) | set(extra))
    with step_timer(example, device, STEPS_PER_WINDOW) as timer, Stopwatch() as watch:
        measured = _Windows.of(timer, counted, everything)
        for round_ in range(windows):
            measured.one_pass(everything, round_)
        contenders = measured.contenders(sizes, extra)
        began = time.perf_counter()
        round_ = windows
        while round_ < sharpen.windows and time.perf_counter() - began < sharpen.seconds:
            measured.one_pass(contenders, round_)
            round_ += 1
        sharpen_seconds = time.perf_counter() - began
    points = measured.points()
    for batch, point in points.items():
        note = "" if batch in sizes else " (extra: not in the sweep's time)"
        print(
            f"    sweep {batch:>4}: level {point.level:>10.1f}  median {point.median:>10.1f}  "
            f"spread {spread(point.windows):>5.1%}  {len(point.windows):>3} windows  "
            f"{point.seconds:5.1f} s{note}",
            flush=True,
        )
    print(
        f"    sharpened {', '.join(map(str, contenders))} (the top 3 and those within {CONTENDER_MARGIN:.0%} "
        f"of the best after {windows} passes, and batchfit's pick) to {round_} windows each in "
        f"{sharpen_seconds:.0f} s",
        flush=True,
    )
    return Sweep(
        {batch: points[batch] for batch in sizes},
        sum(measured.seconds[batch] for batch in sizes),
        watch.cpu_seconds,
        {batch: points[batch] for batch in everything if batch not in sizes},
        contenders,
        sharpen_seconds,
    )


def level_error(sweep: Sweep, batch: int) -> float:
    """The relative standard error of a size's level: 1.2533 x the spread of its windows about
    the fit (pass effects out) over the square root of their count."""
    everything = {**sweep.points, **sweep.extra}
    _, effect = polish(
        table_of({b: p.windows for b, p in everything.items()}, {b: p.passes for b, p in everything.items()})
    )
    point = everything[batch]
    residuals = [
        math.log(v / point.level) - effect[p] for p, v in zip(point.passes, point.windows, strict=True)
    ]
    return 1.2533 * statistics.stdev(residuals) / math.sqrt(len(residuals))


def quality_error(sweep: Sweep, recommended: int, resamples: int = 400) -> float:
    """How far the quality itself may be off: the standard deviation of the median of the paired
    log-ratios (the pick's window over the best's, in each pass that measured both) when the
    passes are redrawn with replacement."""
    if recommended == sweep.best_batch_size:
        return 0.0
    pick, best = sweep.point(recommended), sweep.points[sweep.best_batch_size]
    at_best = dict(zip(best.passes, best.windows, strict=True))
    ratios = [
        math.log(v / at_best[p]) for p, v in zip(pick.passes, pick.windows, strict=True) if p in at_best
    ]
    rng = random.Random(0)
    medians = [statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(resamples)]
    return statistics.stdev(medians)


def half_quality(sweep: Sweep) -> float:
    """How well the truth agrees with itself: the 3% rule applied to the fit of its odd passes,
    scored like batchfit's pick on the fit of its even passes. Below the quality target, the
    target is within the machine's noise."""
    rates = {batch: point.windows for batch, point in sweep.points.items()}
    passes = {batch: point.passes for batch, point in sweep.points.items()}
    odd, _ = polish(table_of(rates, passes, lambda p: p % 2 == 1))
    even, _ = polish(table_of(rates, passes, lambda p: p % 2 == 0))
    bar = math.log(1 - RULE_TOLERANCE) + max(odd.values())
    pick = min(batch for batch, value in odd.items() if value >= bar)
    return math.exp(even[pick] - max(even.values()))


def sweep_pick(sweep: Sweep, counted: int) -> int:
    """What the sweep whose time batchfit's is compared with would pick by the same 3% rule: the
    plain medians of its ``counted`` windows per size."""
    medians = {batch: statistics.median(point.windows[:counted]) for batch, point in sweep.points.items()}
    bar = (1 - RULE_TOLERANCE) * max(medians.values())
    return min(batch for batch, value in medians.items() if value >= bar)


def spread(values: list[float]) -> float:
    middle = statistics.median(values)
    return (max(values) - min(values)) / middle if middle > 0 else 0.0

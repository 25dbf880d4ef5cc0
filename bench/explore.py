"""Benchmark ``batchfit.explore`` against an exhaustive throughput sweep.

For each built-in example, on the CPU, with a fixed ``max_batch`` per example that both share:

* the sweep: the powers of two and the midpoints between consecutive powers (1, 2, 3, 4, 6, 8,
  12, 16, 24, ...) up to ``max_batch``, each measured with ``SWEEP_WINDOWS`` windows of
  ``STEPS_PER_WINDOW`` training steps after a warm-up step and a discarded window (the same
  ``batchfit.explore._Meter``). Its time is the sum of those measurements' times: what a sweep
  of one size at a time takes;
* the truth: the same sizes measured ``TRUTH_WINDOWS`` times (the sweep's windows and more, the
  further ones not counted in its time: on this shared machine a median of 9 windows still
  moves by several percent, more than the 3% tolerance that is being judged). The sizes are
  measured in turn, one window each per pass, alternating the order, so that a slow spell hits
  them alike rather than whichever size ran during it; every window after the first pass follows
  one untimed step at its size (the first step after another shape runs slower: up to 13% for
  the transformer). Then the contenders, the sizes within ``CONTENDER_MARGIN`` (6%) of the best
  median and batchfit's pick, get passes of their own, up to ``SHARPEN.windows`` windows each or
  ``SHARPEN.seconds`` of passes: a window's log-throughput has a standard deviation of 7-12% here,
  which leaves a median of 21 windows 2-3% uncertain, as much as the 3% being judged. The truth
  at a batch size is its level in a median polish of the pass-by-size table (``polish``: each
  pass's common factor divided out, as the contenders' own passes may run in a slower or faster
  spell than the passes over every size); the best is the highest of those;
* batchfit: ``explore(workload, device="cpu", max_batch=B)`` with its defaults (tolerance 0.03,
  3 coarse windows, 20 ms windows), on a freshly built workload; its time is the wall time of
  the call.

Two ratios per example:

* quality: the truth at batchfit's recommended batch size over the truth's best (the
  recommendation is measured within the sweep's passes when it is not a sweep point; that extra
  measurement is not counted in the sweep's time). Target: at least 0.97. Printed with its own
  standard error (``quality +-``, the paired ratios' passes redrawn): a quality a standard error
  or less below the target is within what the truth can tell;
* time: batchfit's seconds over the sweep's seconds. Target: at most 0.40.

glibc's malloc is pinned for the whole run (``batchfit.device.PINNED_MALLOC``, set in the
environment before the process starts; ``--native-malloc`` leaves glibc's defaults). By default
glibc raises its mmap threshold each time it frees a large block, so which batch sizes ran
before decides whether a step's tensors come from the heap or from fresh, page-faulted
mappings: measured on the cnn, batch 32 ran at 375-455 samples/s in a process that had run 16,
32 and 48 in turn and at 469 after one step at 64; batch 16 was the fastest of 16-48 in one
order and the slowest in another. The truth would then be a property of the order the sizes ran
in, not of the batch size. With the thresholds pinned, each size ran alike alone in a process
and in either order (cnn 16-48: 479-541 samples/s, within 6%).

The machine may be shared: the load average is printed at the start and the end, and nothing
else runs in this process while a measurement is taken. Each example gets one untimed warm-up
step first, so neither method pays for first-call setup.

Run: ``.venv/bin/python bench/explore.py`` (``--quick``: smaller bounds and fewer sweep windows,
a smoke test whose ratios are not the benchmark's).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import math
import os
import random
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import _common as tables  # bench/ is the script's directory, so on sys.path
import _workloads
import torch
from _common import Stopwatch

import batchfit
from batchfit.device import PINNED_MALLOC, parse_device, resolve_device
from batchfit.explore import ExploreResult, _Meter

STEPS_PER_WINDOW = 3  # batchfit's default steps_per_window
SWEEP_WINDOWS = 9  # the sweep whose time batchfit's is compared with
TRUTH_WINDOWS = 21  # the truth's windows: the sweep's and more, not counted in its time
QUICK_SWEEP_WINDOWS = 5
QUICK_TRUTH_WINDOWS = 9
#: After the passes over every size, the contenders (within this of the best median, and
#: batchfit's pick) get passes of their own: on this machine a window's log-throughput has a
#: standard deviation of 7-12%, so 21 windows leave a median 2-3% uncertain, as much as the 3%
#: tolerance being judged; 101 windows bring it near 1%.
CONTENDER_MARGIN = 0.06


@dataclass(frozen=True)
class Sharpen:
    windows: int  # a contender's windows in all, the passes over every size included
    seconds: float  # the most time the contenders' own passes may take, per example


SHARPEN = Sharpen(windows=101, seconds=300.0)
QUICK_SHARPEN = Sharpen(windows=15, seconds=20.0)
QUALITY_TARGET = 0.97
TIME_TARGET = 0.40

#: The shared bound per example, chosen so each sweep takes about a minute or less on a quiet
#: 2-core CPU (several times longer when the machine is busy).
MAX_BATCH: dict[str, int] = {"mlp": 512, "cnn": 64, "transformer": 128}
QUICK_MAX_BATCH: dict[str, int] = {"mlp": 128, "cnn": 16, "transformer": 32}
#: On CUDA: the issue's ResNet-50 with AMP up to 512 (on an H100 a sweep read 2671, 2736 and 2742
#: samples/s at 256, 384 and 512), and the built-in examples up to sizes a GPU takes in its stride.
CUDA_MAX_BATCH: dict[str, int] = {"resnet50-amp": 512, "cnn": 1024, "transformer": 512}
CUDA_QUICK_MAX_BATCH: dict[str, int] = {"resnet50-amp": 128, "cnn": 256}
RESULTS_PATH = Path(__file__).resolve().parent / "results" / "explore.json"
QUICK_RESULTS_PATH = RESULTS_PATH.with_name("explore-quick.json")
NOISE_NOTE = (
    "NOTE: wall-clock throughput on a shared, possibly busy machine; other processes can slow "
    "any window. Compare the load averages; rerun when they are high."
)


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
    def best_batch(self) -> int:
        return max(self.points, key=lambda batch: self.points[batch].level)

    @property
    def best(self) -> float:
        return self.points[self.best_batch].level

    def point(self, batch: int) -> SweepPoint:
        return self.points.get(batch) or self.extra[batch]


@dataclass
class BatchfitRun:
    recommended: int
    best_batch: int  # the fastest batch batchfit measured
    confidence: int
    stop_reason: str
    measured: dict[int, list[float]]  # batch size -> its windows, in batchfit's own run
    rounds: dict[int, list[int]]  # batch size -> the round of each of those windows
    seconds: float
    cpu_seconds: float


@dataclass
class Row:
    example: str
    max_batch: int
    unit: str
    sweep: Sweep
    batchfit: BatchfitRun
    quality: float  # the truth at batchfit's recommendation / the truth's best
    time_ratio: float  # batchfit seconds / sweep seconds
    truth_pick: int  # the smallest sweep batch within 3% of the sweep's best
    truth_error: float  # relative standard error of the truth's level at its best
    half_quality: float  # the truth's own 3% pick from its odd windows, scored on its even ones
    quality_error: float  # the quality's relative standard error, from the truth's own windows
    sweep_pick: int  # the sweep's own 3% pick, from the plain medians of its counted windows
    sweep_pick_quality: float  # the truth at the sweep's own pick / the truth's best

    @property
    def quality_met(self) -> bool:
        return self.quality >= QUALITY_TARGET

    @property
    def time_met(self) -> bool:
        return self.time_ratio <= TIME_TARGET


def sweep_sizes(max_batch: int) -> list[int]:
    """Powers of two and the midpoints between consecutive powers, up to and with ``max_batch``."""
    sizes = {max_batch}
    power = 1
    while power <= max_batch:
        sizes.add(power)
        if power >= 2 and power * 3 // 2 <= max_batch:
            sizes.add(power * 3 // 2)
        power *= 2
    return sorted(sizes)


Table = dict[int, dict[int, float]]  # batch size -> pass -> log-throughput of its window


def table_of(rates: dict[int, list[float]], passes: dict[int, list[int]], keep: Any = None) -> Table:
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


def run_sweep(
    example: str,
    device: torch.device,
    max_batch: int,
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
    workload = _workloads.build(example, device)
    meter = _Meter(workload, resolve_device(device, None), STEPS_PER_WINDOW, workload.tokens_per_sample)
    sizes = sweep_sizes(max_batch)
    everything = sorted(set(sizes) | set(extra))
    rates: dict[int, list[float]] = {batch: [] for batch in everything}
    passes: dict[int, list[int]] = {batch: [] for batch in everything}
    seconds = dict.fromkeys(everything, 0.0)

    def one_pass(batches: list[int], round_: int) -> None:
        for batch in sorted(batches, reverse=round_ % 2 == 1):
            if round_ > 0:
                # The first step after another shape runs slower (measured: up to 13% for the
                # transformer): one untimed step puts the size back in its steady state. A sweep
                # of one size at a time would not need it, so it is not counted.
                meter.rewarm(batch)
            begin = time.perf_counter()
            if round_ == 0:
                meter.warm_up(batch)  # a warm-up step and a discarded first window
            rates[batch].append(meter.window(batch))
            passes[batch].append(round_)
            if round_ < counted:
                seconds[batch] += time.perf_counter() - begin
        meter.reset()

    contenders: list[int] = []
    try:
        with Stopwatch() as watch:
            for round_ in range(windows):
                one_pass(everything, round_)
            level, _ = polish(table_of(rates, passes))
            ranked = sorted(sizes, key=level.__getitem__, reverse=True)
            floor = level[ranked[0]] + math.log(1 - CONTENDER_MARGIN)
            # At least three: a size measured in passes of its own would carry their drift alone.
            chosen = {*ranked[:3], *extra, *(batch for batch in sizes if level[batch] >= floor)}
            contenders = sorted(chosen)
            began = time.perf_counter()
            round_ = windows
            while round_ < sharpen.windows and time.perf_counter() - began < sharpen.seconds:
                one_pass(contenders, round_)
                round_ += 1
            sharpen_seconds = time.perf_counter() - began
    finally:
        meter.close()
    level, _ = polish(table_of(rates, passes))
    points = {
        batch: SweepPoint(
            batch,
            rates[batch],
            passes[batch],
            statistics.median(rates[batch]),
            math.exp(level[batch]),
            seconds[batch],
        )
        for batch in everything
    }
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
        sum(seconds[batch] for batch in sizes),
        watch.cpu_seconds,
        {batch: points[batch] for batch in everything if batch not in sizes},
        contenders,
        sharpen_seconds,
    )


def run_batchfit(example: str, device: torch.device, max_batch: int) -> tuple[BatchfitRun, ExploreResult]:
    workload = _workloads.build(example, device)
    with Stopwatch() as watch:
        result = batchfit.explore(workload, device=device, max_batch=max_batch)
    run = BatchfitRun(
        recommended=result.recommendation.batch_size,
        best_batch=result.recommendation.best_batch_size,
        confidence=result.recommendation.confidence,
        stop_reason=result.stop_reason,
        measured={point.batch_size: list(point.samples_per_second) for point in result.points},
        rounds={point.batch_size: list(point.rounds) for point in result.points},
        seconds=watch.seconds,
        cpu_seconds=watch.cpu_seconds,
    )
    return run, result


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
    if recommended == sweep.best_batch:
        return 0.0
    pick, best = sweep.point(recommended), sweep.points[sweep.best_batch]
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
    pick = min(batch for batch, value in odd.items() if value >= math.log(1 - 0.03) + max(odd.values()))
    return math.exp(even[pick] - max(even.values()))


def sweep_pick(sweep: Sweep, counted: int) -> int:
    """What the sweep whose time batchfit's is compared with would pick by the same 3% rule: the
    plain medians of its ``counted`` windows per size."""
    medians = {batch: statistics.median(point.windows[:counted]) for batch, point in sweep.points.items()}
    return min(batch for batch, value in medians.items() if value >= (1 - 0.03) * max(medians.values()))


def spread(values: list[float]) -> float:
    middle = statistics.median(values)
    return (max(values) - min(values)) / middle if middle > 0 else 0.0


def warm_up(example: str, device: torch.device) -> None:
    """One untimed training window so neither method pays for first-call kernel setup."""
    workload = _workloads.build(example, device)
    meter = _Meter(workload, resolve_device(device, None), 1, workload.tokens_per_sample)
    try:
        meter.warm_up(4)
        meter.window(4)
    finally:
        meter.close()


def bench_one(
    example: str, device: torch.device, max_batch: int, counted: int, windows: int, sharpen: Sharpen
) -> Row:
    warm_up(example, device)
    ours, result = run_batchfit(example, device, max_batch)
    print(
        f"  batchfit: recommends {ours.recommended} (fastest measured {ours.best_batch}, confidence "
        f"{ours.confidence}, {ours.stop_reason}) in {ours.seconds:.1f} s; measured "
        + ", ".join(f"{b}x{len(v)}" for b, v in ours.measured.items()),
        flush=True,
    )
    sweep = run_sweep(example, device, max_batch, counted, windows, [ours.recommended], sharpen)
    quality = sweep.point(ours.recommended).level / sweep.best
    truth_pick = min(b for b, p in sweep.points.items() if p.level >= (1 - 0.03) * sweep.best)
    counted_pick = sweep_pick(sweep, counted)
    row = Row(
        example,
        max_batch,
        result.unit,
        sweep,
        ours,
        quality,
        ours.seconds / sweep.seconds,
        truth_pick,
        level_error(sweep, sweep.best_batch),
        half_quality(sweep),
        quality_error(sweep, ours.recommended),
        counted_pick,
        sweep.points[counted_pick].level / sweep.best,
    )
    print(
        f"  sweep: best {sweep.best:.1f} {result.unit} at {sweep.best_batch} (+-{row.truth_error:.1%}), "
        f"smallest within 3% {truth_pick}, {len(sweep.points)} sizes in {sweep.seconds:.1f} s; "
        f"quality {quality:.3f} (+-{row.quality_error:.1%}), time {row.time_ratio:.3f}; the truth's own "
        f"pick from half its windows scores {row.half_quality:.3f} on the other half; the "
        f"{counted}-window sweep's own 3% pick, {row.sweep_pick}, scores {row.sweep_pick_quality:.3f}",
        flush=True,
    )
    return row


HEADERS = (
    "example",
    "max_batch",
    "unit",
    "sweep best (batch)",
    "sweep 3% pick",
    "truth +-",
    "truth self",
    "sweep's own pick",
    "bf pick",
    "bf conf",
    "bf stop",
    "quality",
    "quality +-",
    "bf s",
    "sweep s",
    "time ratio",
    "targets",
)


def table_rows(rows: list[Row]) -> list[list[str]]:
    lines = []
    for row in rows:
        targets = f"{'ok' if row.quality_met else 'MISS'}/{'ok' if row.time_met else 'MISS'}"
        lines.append(
            [
                row.example,
                str(row.max_batch),
                row.unit,
                f"{row.sweep.best:.0f} ({row.sweep.best_batch})",
                str(row.truth_pick),
                f"{row.truth_error:.1%}",
                f"{row.half_quality:.3f}",
                f"{row.sweep_pick} ({row.sweep_pick_quality:.3f})",
                str(row.batchfit.recommended),
                str(row.batchfit.confidence),
                row.batchfit.stop_reason,
                f"{row.quality:.3f}",
                f"{row.quality_error:.1%}",
                f"{row.batchfit.seconds:.1f}",
                f"{row.sweep.seconds:.1f}",
                f"{row.time_ratio:.3f}",
                targets,
            ]
        )
    return lines


def print_text_table(rows: list[Row]) -> None:
    tables.print_text_table(HEADERS, table_rows(rows))


def print_markdown_table(rows: list[Row]) -> None:
    tables.print_markdown_table(HEADERS, table_rows(rows), text_columns=(0, 2, 10, 16))


def _load_average() -> str:
    try:
        return " ".join(f"{value:.2f}" for value in os.getloadavg())
    except OSError:
        return "unknown"


def versions() -> dict[str, str | None]:
    found: dict[str, str | None] = {}
    for package in ("torch", "batchfit"):
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            found[package] = None
    return found


def row_dict(row: Row) -> dict[str, Any]:
    return {
        **asdict(row),
        "quality_met": row.quality_met,
        "time_met": row.time_met,
        "sweep_best": row.sweep.best,
        "sweep_best_batch": row.sweep.best_batch,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda[:N]")
    parser.add_argument("--quick", action="store_true", help="smaller bounds, fewer sweep windows")
    parser.add_argument("--examples", default=None, help="comma-separated workloads (default: all)")
    parser.add_argument(
        "--json",
        type=Path,
        default=None,
        help=f"results file (default {RESULTS_PATH}, with --quick {QUICK_RESULTS_PATH.name})",
    )
    parser.add_argument("--no-json", action="store_true", help="do not write the results file")
    parser.add_argument(
        "--native-malloc", action="store_true", help="keep glibc's malloc defaults (its thresholds move)"
    )
    args = parser.parse_args(argv)
    if not args.native_malloc and any(os.environ.get(key) != value for key, value in PINNED_MALLOC.items()):
        # glibc reads these once, at start-up: run this script again with them set.
        os.environ.update(PINNED_MALLOC)
        os.execv(sys.executable, [sys.executable, __file__, *(sys.argv[1:] if argv is None else argv)])
    malloc = "native" if args.native_malloc else " ".join(f"{k}={v}" for k, v in PINNED_MALLOC.items())
    json_path: Path = args.json or (QUICK_RESULTS_PATH if args.quick else RESULTS_PATH)
    device = parse_device(args.device)
    if device.type == "cuda":
        bounds = CUDA_QUICK_MAX_BATCH if args.quick else CUDA_MAX_BATCH
        json_path = args.json or json_path.with_name(json_path.stem + "-cuda.json")
    else:
        bounds = QUICK_MAX_BATCH if args.quick else MAX_BATCH
    counted = QUICK_SWEEP_WINDOWS if args.quick else SWEEP_WINDOWS
    windows = QUICK_TRUTH_WINDOWS if args.quick else TRUTH_WINDOWS
    sharpen = QUICK_SHARPEN if args.quick else SHARPEN
    examples = args.examples.split(",") if args.examples else list(bounds)
    skipped = {name: why for name in examples if (why := _workloads.missing(name)) is not None}
    for name, why in skipped.items():
        print(f"{name}: skipped: {why}")
    examples = [name for name in examples if name not in skipped]
    unknown = sorted(set(examples) - set(bounds))
    if unknown:
        parser.error(f"unknown example(s) {', '.join(unknown)}: choose from {', '.join(bounds)}")

    began = time.perf_counter()
    load_at_start = _load_average()
    found = ", ".join(f"{name} {version or 'not installed'}" for name, version in versions().items())
    where = (
        torch.cuda.get_device_name(device) if device.type == "cuda" else f"{torch.get_num_threads()} threads"
    )
    print(f"{found}; {where}; load average {load_at_start} (1, 5, 15 min)")
    print(f"malloc: {malloc}")
    print(NOISE_NOTE)
    print(
        f"sweep: powers of two and midpoints, {counted} windows of {STEPS_PER_WINDOW} steps each "
        f"(the truth: {windows}, then the contenders within {CONTENDER_MARGIN:.0%} of the best up to "
        f"{sharpen.windows} or {sharpen.seconds:.0f} s); "
        "batchfit: explore defaults (tolerance 0.03, 3 coarse windows of 20 ms)"
        + ("; --quick" if args.quick else "")
    )
    rows: list[Row] = []
    for example in examples:
        print(f"{example} (max_batch {bounds[example]}):", flush=True)
        rows.append(bench_one(example, device, bounds[example], counted, windows, sharpen))

    print()
    print_text_table(rows)
    print()
    all_quality = all(row.quality_met for row in rows)
    all_time = all(row.time_met for row in rows)
    for row in rows:
        print(
            f"{row.example}: quality {row.quality:.3f} (target >= {QUALITY_TARGET}: "
            f"{'met' if row.quality_met else 'NOT met'}), time ratio {row.time_ratio:.3f} "
            f"(target <= {TIME_TARGET}: {'met' if row.time_met else 'NOT met'})"
        )
    met_quality, met_time = sum(row.quality_met for row in rows), sum(row.time_met for row in rows)
    print(f"quality target (>= {QUALITY_TARGET}) met in {met_quality}/{len(rows)} examples")
    print(f"time target (<= {TIME_TARGET}) met in {met_time}/{len(rows)} examples")
    total = time.perf_counter() - began
    load_at_end = _load_average()
    print(f"total wall time {total:.0f} s; load average {load_at_start} at start, {load_at_end} at end")
    print(NOISE_NOTE)
    print()
    print_markdown_table(rows)
    if not args.no_json:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        payload = {
            "device": str(device),
            "quick": args.quick,
            "steps_per_window": STEPS_PER_WINDOW,
            "sweep_windows": counted,
            "truth_windows": windows,
            "sharpen": asdict(sharpen),
            "contender_margin": CONTENDER_MARGIN,
            "targets": {"quality": QUALITY_TARGET, "time_ratio": TIME_TARGET},
            "versions": versions(),
            "torch_threads": torch.get_num_threads(),
            "malloc": malloc,
            "total_seconds": total,
            "load_average_at_start": load_at_start,
            "load_average_at_end": load_at_end,
            "rows": [row_dict(row) for row in rows],
        }
        json_path.write_text(json.dumps(payload, indent=1))
        print(f"\nwrote {json_path}")
    return 0 if all_quality and all_time else 1


if __name__ == "__main__":
    sys.exit(main())

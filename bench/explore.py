"""Benchmark ``batchfit.explore`` against an exhaustive throughput sweep.

For each example, with one ``max_batch_size`` that both share: the truth is a sweep of the powers
of two and their midpoints, measured in many passes (``_sweep.py``); batchfit is ``explore`` with
its defaults on a freshly built workload. Two ratios: quality, the truth at batchfit's pick over
the truth's best (target at least 0.97), and time, batchfit's seconds over a 9-window sweep's
(target at most 0.40). glibc's malloc is pinned for the run (``--native-malloc`` leaves it).

Run: ``.venv/bin/python bench/explore.py [--device cuda]`` (10-13 minutes on 2 CPU cores; on
CUDA the contenders are sharpened for at most 60 s, not 300, so that ResNet-50 with AMP fits one
10-minute device call; ``--quick``: smaller bounds and fewer windows, a smoke test whose ratios
are not the benchmark's).
"""

from __future__ import annotations

import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import _harness
import _sweep
import _workloads
import torch
from _sweep import RULE_TOLERANCE, Sharpen, Sweep

import batchfit
from batchfit.explore import ExploreResult
from batchfit.runtime.devices.host import PINNED_MALLOC
from batchfit.runtime.devices.resolve import parse_device

QUALITY_TARGET = 0.97
TIME_TARGET = 0.40
PACKAGES = ("torch", "batchfit")

#: The shared bound per example, chosen so each sweep takes about a minute or less on a quiet
#: 2-core CPU (several times longer when the machine is busy).
MAX_BATCH_SIZE: dict[str, int] = {"mlp": 512, "cnn": 64, "transformer": 128}
QUICK_MAX_BATCH_SIZE: dict[str, int] = {"mlp": 128, "cnn": 16, "transformer": 32}
#: On CUDA: the issue's ResNet-50 with AMP up to 512, and the built-in examples up to sizes a GPU
#: takes in its stride.
CUDA_MAX_BATCH_SIZE: dict[str, int] = {"resnet50-amp": 512, "cnn": 1024, "transformer": 512}
CUDA_QUICK_MAX_BATCH_SIZE: dict[str, int] = {"resnet50-amp": 128, "cnn": 256}
RESULTS_PATH = _harness.RESULTS / "explore.json"
QUICK_RESULTS_PATH = RESULTS_PATH.with_name("explore-quick.json")
NOISE_NOTE = (
    "NOTE: wall-clock throughput on a shared, possibly busy machine; other processes can slow "
    "any window. Compare the load averages; rerun when they are high."
)


@dataclass
class BatchfitRun:
    recommended: int
    best_batch_size: int  # the fastest batch batchfit measured
    confidence: int
    stop_reason: str
    measured: dict[int, list[float]]  # batch size -> its windows, in batchfit's own run
    rounds: dict[int, list[int]]  # batch size -> the round of each of those windows
    seconds: float
    cpu_seconds: float


@dataclass
class Row:
    example: str
    max_batch_size: int
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

    @property
    def no_larger(self) -> bool:
        """The rule's judgement: the pick is no larger than the truth's smallest within 3%."""
        return self.batchfit.recommended <= self.truth_pick

    def to_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "quality_met": self.quality_met,
            "time_met": self.time_met,
            "no_larger": self.no_larger,
            "sweep_best": self.sweep.best,
            "sweep_best_batch_size": self.sweep.best_batch_size,
        }


def run_batchfit(
    example: str, device: torch.device, max_batch_size: int
) -> tuple[BatchfitRun, ExploreResult]:
    workload = _workloads.build(example, device)
    with _harness.Stopwatch() as watch:
        sizes = batchfit.BatchSizes(max_batch_size=max_batch_size)
        result = batchfit.explore(workload, device=device, sizes=sizes)
    run = BatchfitRun(
        recommended=result.recommendation.batch_size,
        best_batch_size=result.recommendation.best_batch_size,
        confidence=result.recommendation.confidence,
        stop_reason=result.stop_reason,
        measured={point.batch_size: list(point.samples_per_second) for point in result.points},
        rounds={point.batch_size: list(point.rounds) for point in result.points},
        seconds=watch.seconds,
        cpu_seconds=watch.cpu_seconds,
    )
    return run, result


def warm_up(example: str, device: torch.device) -> None:
    """One untimed training window so neither method pays for first-call kernel setup."""
    with _sweep.step_timer(example, device, 1) as timer:
        timer.first_visit(4)
        timer.window(4)


def bench_one(
    example: str, device: torch.device, max_batch_size: int, counted: int, windows: int, sharpen: Sharpen
) -> Row:
    warm_up(example, device)
    ours, result = run_batchfit(example, device, max_batch_size)
    print(
        f"  batchfit: recommends {ours.recommended} (fastest measured {ours.best_batch_size}, "
        f"confidence {ours.confidence}, {ours.stop_reason}) in {ours.seconds:.1f} s; measured "
        + ", ".join(f"{b}x{len(v)}" for b, v in ours.measured.items()),
        flush=True,
    )
    sweep = _sweep.run_sweep(example, device, max_batch_size, counted, windows, [ours.recommended], sharpen)
    quality = sweep.point(ours.recommended).level / sweep.best
    truth_pick = min(b for b, p in sweep.points.items() if p.level >= (1 - RULE_TOLERANCE) * sweep.best)
    counted_pick = _sweep.sweep_pick(sweep, counted)
    row = Row(
        example,
        max_batch_size,
        result.unit,
        sweep,
        ours,
        quality,
        ours.seconds / sweep.seconds,
        truth_pick,
        _sweep.level_error(sweep, sweep.best_batch_size),
        _sweep.half_quality(sweep),
        _sweep.quality_error(sweep, ours.recommended),
        counted_pick,
        sweep.points[counted_pick].level / sweep.best,
    )
    print(
        f"  sweep: best {sweep.best:.1f} {result.unit} at {sweep.best_batch_size} "
        f"(+-{row.truth_error:.1%}), smallest within 3% {truth_pick}, {len(sweep.points)} sizes in "
        f"{sweep.seconds:.1f} s; quality {quality:.3f} (+-{row.quality_error:.1%}), time "
        f"{row.time_ratio:.3f}; the truth's own pick from half its windows scores "
        f"{row.half_quality:.3f} on the other half; the {counted}-window sweep's own 3% pick, "
        f"{row.sweep_pick}, scores {row.sweep_pick_quality:.3f}",
        flush=True,
    )
    return row


HEADERS = (
    "example",
    "max_batch_size",
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
                str(row.max_batch_size),
                row.unit,
                f"{row.sweep.best:.0f} ({row.sweep.best_batch_size})",
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


def print_summary(rows: list[Row]) -> None:
    for row in rows:
        print(
            f"{row.example}: quality {row.quality:.3f} (target >= {QUALITY_TARGET}: "
            f"{'met' if row.quality_met else 'NOT met'}), time ratio {row.time_ratio:.3f} "
            f"(target <= {TIME_TARGET}: {'met' if row.time_met else 'NOT met'}), pick "
            f"{row.batchfit.recommended} {'no larger than' if row.no_larger else 'LARGER than'} the "
            f"rule's {row.truth_pick}"
        )
    met_quality, met_time = sum(row.quality_met for row in rows), sum(row.time_met for row in rows)
    print(f"quality target (>= {QUALITY_TARGET}) met in {met_quality}/{len(rows)} examples")
    print(f"time target (<= {TIME_TARGET}) met in {met_time}/{len(rows)} examples")
    print(f"pick no larger than the rule's in {sum(row.no_larger for row in rows)}/{len(rows)} examples")


def main(argv: list[str] | None = None) -> int:
    parser = _harness.parser(
        __doc__,
        quick="smaller bounds, fewer sweep windows",
        json_default="bench/results/explore.json; explore-quick.json with --quick, -cuda on CUDA",
    )
    parser.add_argument("--examples", default=None, help="comma-separated workloads (default: all)")
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
        bounds = CUDA_QUICK_MAX_BATCH_SIZE if args.quick else CUDA_MAX_BATCH_SIZE
        json_path = args.json or json_path.with_name(json_path.stem + "-cuda.json")
    else:
        bounds = QUICK_MAX_BATCH_SIZE if args.quick else MAX_BATCH_SIZE
    counted = _sweep.QUICK_SWEEP_WINDOWS if args.quick else _sweep.SWEEP_WINDOWS
    windows = _sweep.QUICK_TRUTH_WINDOWS if args.quick else _sweep.TRUTH_WINDOWS
    sharpen = _sweep.QUICK_SHARPEN if args.quick else _sweep.SHARPEN
    if device.type == "cuda" and not args.quick:
        sharpen = _sweep.CUDA_SHARPEN
    examples = args.examples.split(",") if args.examples else list(bounds)
    skipped = {name: why for name in examples if (why := _workloads.missing(name)) is not None}
    for name, why in skipped.items():
        print(f"{name}: skipped: {why}")
    examples = [name for name in examples if name not in skipped]
    unknown = sorted(set(examples) - set(bounds))
    if unknown:
        parser.error(f"unknown example(s) {', '.join(unknown)}: choose from {', '.join(bounds)}")

    session = _harness.Session(device, PACKAGES)
    print(session.machine())
    print(f"malloc: {malloc}")
    print(NOISE_NOTE)
    print(
        f"sweep: powers of two and midpoints, {counted} windows of {_sweep.STEPS_PER_WINDOW} steps each "
        f"(the truth: {windows}, then the contenders within {_sweep.CONTENDER_MARGIN:.0%} of the best up "
        f"to {sharpen.windows} or {sharpen.seconds:.0f} s); "
        "batchfit: explore defaults (tolerance 0.03, 3 coarse windows of 20 ms)"
        + ("; --quick" if args.quick else "")
    )
    rows: list[Row] = []
    for example in examples:
        print(f"{example} (max_batch_size {bounds[example]}):", flush=True)
        rows.append(bench_one(example, device, bounds[example], counted, windows, sharpen))

    print()
    _harness.print_text_table(HEADERS, table_rows(rows))
    print()
    print_summary(rows)
    print(session.finish())
    print(NOISE_NOTE)
    print()
    _harness.print_markdown_table(HEADERS, table_rows(rows), text_columns=(0, 2, 10, 16))
    if not args.no_json:
        payload = {
            "quick": args.quick,
            "steps_per_window": _sweep.STEPS_PER_WINDOW,
            "sweep_windows": counted,
            "truth_windows": windows,
            "sharpen": asdict(sharpen),
            "contender_margin": _sweep.CONTENDER_MARGIN,
            "targets": {"quality": QUALITY_TARGET, "time_ratio": TIME_TARGET},
            "torch_threads": torch.get_num_threads(),
            "malloc": malloc,
            "rows": [row.to_dict() for row in rows],
        }
        _harness.write_results(json_path, session, payload)
    return 0 if all(row.quality_met and row.time_met for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

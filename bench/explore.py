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

import argparse
import os
import sys
from dataclasses import asdict
from pathlib import Path

import _harness
import _sweep
import _workloads
import torch
from _explore_rows import HEADERS, QUALITY_TARGET, TIME_TARGET, BatchfitRun, Row, print_summary, table_rows
from _sweep import RULE_TOLERANCE, Sharpen

import batchfit
from batchfit.exploration.explore_result import ExploreResult
from batchfit.runtime.devices.host import PINNED_MALLOC
from batchfit.runtime.devices.resolve import parse_device

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


def settings(
    args: argparse.Namespace, device: torch.device
) -> tuple[Path, dict[str, int], tuple[int, int, Sharpen]]:
    """The results file, each example's bound and the sweep's counted windows, truth windows and
    sharpening, by ``--quick`` and the device."""
    json_path: Path = args.json or (QUICK_RESULTS_PATH if args.quick else RESULTS_PATH)
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
    return json_path, bounds, (counted, windows, sharpen)


def chosen(parser: argparse.ArgumentParser, names: str | None, bounds: dict[str, int]) -> list[str]:
    """``--examples`` (default: every bounded one) less those whose workload cannot be built here."""
    examples = names.split(",") if names else list(bounds)
    skipped = {name: why for name in examples if (why := _workloads.missing(name)) is not None}
    for name, why in skipped.items():
        print(f"{name}: skipped: {why}")
    examples = [name for name in examples if name not in skipped]
    unknown = sorted(set(examples) - set(bounds))
    if unknown:
        parser.error(f"unknown example(s) {', '.join(unknown)}: choose from {', '.join(bounds)}")
    return examples


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
    device = parse_device(args.device)
    json_path, bounds, sweep = settings(args, device)
    counted, windows, sharpen = sweep
    examples = chosen(parser, args.examples, bounds)
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

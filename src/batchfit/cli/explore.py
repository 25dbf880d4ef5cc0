"""``batchfit explore``: training throughput against batch size, with a live recommendation."""

from __future__ import annotations

import argparse
from typing import Any

import batchfit
from batchfit import BatchSizes, Goal, Timing, Where
from batchfit.cli import flags


def add_parser(commands: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = commands.add_parser(
        "explore",
        help="training throughput against batch size, with a recommendation",
        description="Measure training throughput up to the memory-safe maximum and recommend a micro-batch.",
    )
    flags.add_workload(parser)
    flags.add_where(parser)
    flags.add_options(
        parser,
        BatchSizes,
        help={"max_batch_size": "the largest batch to measure (default: the memory-safe maximum)"},
    )
    flags.add_options(
        parser, Timing, help={"windows": "timing windows per batch size in the coarse pass (at least 2)"}
    )
    flags.add_options(parser, Goal)
    flags.add_output(parser, ("text", "json", "csv"))
    return parser


def run(args: argparse.Namespace) -> int:
    where = flags.options(args, Where)
    sizes, timing, goal = (
        flags.options(args, BatchSizes),
        flags.options(args, Timing),
        flags.options(args, Goal),
    )
    return flags.run_launched(args, where, lambda: _run(args, where, sizes, timing, goal))


def _run(args: argparse.Namespace, where: Where, sizes: BatchSizes, timing: Timing, goal: Goal) -> int:
    workload = flags.workload(args, where)
    with flags.progress(args, "explore") as display:
        result = batchfit.explore(
            workload,
            where=where,
            sizes=sizes,
            timing=timing,
            goal=goal,
            on_progress=display.hear,
        )
        flags.say(f"stopped ({result.stop_reason}) after {result.explore_seconds:.1f} s.")
        if result.unsettled is not None:
            flags.say(f"{result.recommendation.line()}; {result.unsettled.line()}")
    document = flags.envelope(args, workload.name, [result], tolerance=goal.tolerance)
    flags.publish(args, document, {"text": result.table, "csv": result.to_csv})
    return 0

"""``batchfit explore``: training throughput against batch size, with a live recommendation."""

from __future__ import annotations

import argparse
from typing import Any

from batchfit.cli import flags
from batchfit.explore import explore
from batchfit.policy.choose import Recommendation
from batchfit.runtime.devices.host import malloc_advice
from batchfit.runtime.devices.resolve import parse_device


def add_parser(commands: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = commands.add_parser(
        "explore",
        help="training throughput against batch size, with a recommendation",
        description="Measure training throughput up to the memory-safe maximum and recommend a micro-batch.",
    )
    flags.add_workload(parser)
    flags.add_device(parser)
    flags.add_bounds(parser, "the largest batch to measure (default: the memory-safe maximum)")
    parser.add_argument(
        "--tolerance",
        type=float,
        default=0.03,
        help="within this of the best counts as as fast (default: %(default)s)",
    )
    parser.add_argument(
        "--objective",
        choices=("smallest-within-tolerance", "max-throughput"),
        default="smallest-within-tolerance",
    )
    parser.add_argument(
        "--base-batch-size",
        type=int,
        default=None,
        help="the speed-up's base (default: the smallest measured)",
    )
    parser.add_argument(
        "--world-size",
        type=int,
        default=None,
        help="devices, with --global-batch-size (default: the ranks under torchrun, else 1)",
    )
    parser.add_argument(
        "--global-batch-size", type=int, default=None, help="the micro-batch must divide it / --world-size"
    )
    parser.add_argument(
        "--windows",
        type=int,
        default=3,
        help="timing windows per batch size in the coarse pass (default: %(default)s)",
    )
    parser.add_argument(
        "--steps-per-window",
        type=int,
        default=None,
        help="steps per window (default: the fewest that last 20 ms)",
    )
    parser.add_argument(
        "--time-budget-seconds", type=float, default=None, help="stop after this many seconds"
    )
    parser.add_argument(
        "--confidence-target",
        type=int,
        default=90,
        help="the confidence asked of the recommendation; stop once it is reached (default: %(default)s)",
    )
    flags.add_output(parser, ("text", "json", "csv"))
    flags.add_report(parser)
    return parser


def run(args: argparse.Namespace) -> int:
    return flags.run_launched(args, args.device, lambda: _run(args))


def _run(args: argparse.Namespace) -> int:
    advice = malloc_advice() if parse_device(args.device).type == "cpu" else None
    notes = [f"note: {advice}"] if advice else []

    workload = flags.workload(args)
    display = flags.progress(args, "explore")

    def live(recommendation: Recommendation) -> None:
        while notes:  # once the measuring has begun: bad input gets its error alone
            flags.say(notes.pop())
        display.recommend(recommendation)
        flags.say(recommendation.line())

    with display:
        result = explore(
            workload,
            device=args.device,
            memory_limit=args.memory_limit,
            memory_fraction=args.memory_fraction,
            min_batch_size=args.min_batch_size,
            max_batch_size=args.max_batch_size,
            tolerance=args.tolerance,
            objective=args.objective,
            base_batch_size=args.base_batch_size,
            world_size=args.world_size,
            global_batch_size=args.global_batch_size,
            multiple_of=args.multiple_of,
            windows=args.windows,
            steps_per_window=args.steps_per_window,
            time_budget_seconds=args.time_budget_seconds,
            confidence_target=args.confidence_target,
            on_update=live,
            on_trial=lambda trial: display.trial("train", trial),
            on_trial_start=lambda batch_size: display.start("train", batch_size),
        )
        flags.say(f"stopped ({result.stop_reason}) after {result.explore_seconds:.1f} s.")
    document = {  # what ran, beside the result's own fields
        **result.to_dict(),
        **flags.what_ran(workload.name),
        "device": str(parse_device(args.device)),
        "tolerance": args.tolerance,
    }
    flags.publish(args, document, text=result.table, csv=result.to_csv)
    return 0

"""``batchfit check-data``: whether data loading holds training back at a batch size, and the
DataLoader setting that stops it."""

from __future__ import annotations

import argparse
from typing import Any

import batchfit
from batchfit import LoaderSetting, Where
from batchfit.cli import flags


def add_parser(commands: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = commands.add_parser(
        "check-data",
        help="whether data loading is the bottleneck, and the DataLoader setting that fixes it",
        description=(
            "Time the DataLoader alone, the training step alone and the two together at one batch "
            "size; when the loader holds training back, measure num_workers, prefetch_factor and "
            "(on CUDA) pin_memory, and recommend the cheapest setting within --tolerance of the best."
        ),
    )
    flags.add_workload(parser)
    parser.add_argument(
        "--loader",
        metavar="MODULE:FUNCTION",
        default=None,
        help="a factory (batch_size=..., num_workers=..., ...) -> DataLoader (default: a DataLoader "
        "over the workload's dataset)",
    )
    parser.add_argument("--batch-size", type=int, required=True, help="the batch size to check")
    flags.add_where(parser, memory=False)
    flags.add_options(parser, LoaderSetting)
    parser.add_argument(
        "--max-num-workers",
        type=int,
        default=None,
        help="the most workers to try (default: the cores this process may use)",
    )
    parser.add_argument(
        "--tolerance",
        type=float,
        default=0.03,
        help="within this of the best counts as as fast (default: %(default)s)",
    )
    parser.add_argument(
        "--window-seconds",
        type=float,
        default=1.0,
        help="the timed length of each pass (default: %(default)s)",
    )
    parser.add_argument(
        "--time-budget-seconds", type=float, default=None, help="start no setting after this many seconds"
    )
    flags.add_output(parser, ("text", "json"))
    return parser


def run(args: argparse.Namespace) -> int:
    where = flags.options(args, Where)
    current = flags.options(args, LoaderSetting)
    return flags.run_launched(args, where, lambda: _run(args, where, current))


def _run(args: argparse.Namespace, where: Where, current: LoaderSetting) -> int:
    workload = flags.workload(args, where)
    with flags.progress(args, "check-data", noun="settings") as display:
        result = batchfit.check_data(
            workload,
            args.batch_size,
            device=where.device,
            loader=args.loader,
            current=current,
            max_num_workers=args.max_num_workers,
            tolerance=args.tolerance,
            window_seconds=args.window_seconds,
            time_budget_seconds=args.time_budget_seconds,
            on_progress=display.hear,
        )
        flags.say(f"{result.summary()} ({result.seconds:.1f} s)")
    document = {**result.to_dict(), **flags.what_ran(workload.name)}
    flags.publish(args, document, {"text": result.table})
    return 0

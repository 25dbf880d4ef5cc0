"""``batchfit check-data``: whether data loading holds training back at a batch size, and the
DataLoader setting that stops it."""

from __future__ import annotations

import argparse
from typing import Any

import batchfit
from batchfit import Timing, Where
from batchfit.cli import flags
from batchfit.policy.explore.loader_settings import LoaderSearch, LoaderSetting


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
    flags.add_options(parser, LoaderSearch)
    flags.add_options(
        parser,
        flags.default_of(batchfit.check_data, "timing"),
        exclude=("windows", "steps_per_window"),
        help={"time_budget_seconds": "the whole check's time: start no setting that would not fit in it"},
    )
    flags.add_output(parser, ("text", "json"))
    return parser


def run(args: argparse.Namespace) -> int:
    where = flags.options(args, Where)
    search = flags.options(args, LoaderSearch, current=flags.options(args, LoaderSetting))
    timing = flags.options(args, Timing)
    return flags.run_launched(args, where, lambda: _run(args, where, search, timing))


def _run(args: argparse.Namespace, where: Where, search: LoaderSearch, timing: Timing) -> int:
    workload = flags.workload(args, where)
    with flags.progress(args, "check-data", noun="settings") as display:
        result = batchfit.check_data(
            workload,
            args.batch_size,
            where=where,
            loader=args.loader,
            search=search,
            timing=timing,
            on_progress=display.hear,
        )
        flags.say(f"{result.summary()} ({result.seconds:.1f} s)")
    document = flags.envelope(args, workload.name, [result])
    flags.publish(args, document, {"text": result.table})
    return 0

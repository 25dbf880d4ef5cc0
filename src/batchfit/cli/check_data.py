"""``batchfit check-data``: whether data loading holds training back at a batch size, and the
DataLoader setting that stops it."""

from __future__ import annotations

import argparse
from typing import Any

from batchfit.check_data import check_data
from batchfit.cli import flags
from batchfit.policy.loader_settings import SettingRow
from batchfit.runtime.workloads.specs import load_function


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
    parser.add_argument(
        "--device", default=None, help="cpu, cuda or cuda:N (default: cuda if available, else cpu)"
    )
    flags.add_ranks(parser)
    parser.add_argument(
        "--num-workers", type=int, default=0, help="the setting used now (default: %(default)s)"
    )
    parser.add_argument("--pin-memory", action="store_true", help="the setting used now pins memory")
    parser.add_argument(
        "--persistent-workers", action="store_true", help="the setting used now keeps its workers"
    )
    parser.add_argument(
        "--prefetch-factor", type=int, default=None, help="the setting used now (default: the DataLoader's)"
    )
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
    flags.add_report(parser)
    return parser


def run(args: argparse.Namespace) -> int:
    return flags.run_launched(args, args.device, lambda: _run(args))


def _run(args: argparse.Namespace) -> int:
    loader = None if args.loader is None else load_function(args.loader, "--loader")

    workload = flags.workload(args)
    display = flags.progress(args, "check-data", noun="settings")

    def measured(row: SettingRow) -> None:
        display.finish("", f"{row.setting.describe()}: {row.samples_per_second:.1f} samples/s")
        flags.say(
            f"{row.setting.describe():<40} {row.samples_per_second:10.1f} samples/s  "
            f"data wait {row.data_wait_share:6.1%}"
        )

    with display:
        result = check_data(
            workload,
            args.batch_size,
            device=args.device,
            loader=loader,
            num_workers=args.num_workers,
            pin_memory=args.pin_memory,
            persistent_workers=args.persistent_workers,
            prefetch_factor=args.prefetch_factor,
            max_num_workers=args.max_num_workers,
            tolerance=args.tolerance,
            window_seconds=args.window_seconds,
            time_budget_seconds=args.time_budget_seconds,
            on_setting=measured,
        )
        flags.say(f"{result.summary()} ({result.seconds:.1f} s)")
    document = {**result.to_dict(), **flags.what_ran(workload.name)}
    flags.publish(args, document, text=result.table)
    return 0

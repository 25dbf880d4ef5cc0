"""``batchfit compare``: what each technique buys on the workload (batch, memory, throughput)."""

from __future__ import annotations

import argparse
from typing import Any

from batchfit.cli import flags
from batchfit.compare import ComparisonRow, compare
from batchfit.policy.techniques import TECHNIQUES


def add_parser(commands: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = commands.add_parser(
        "compare",
        help="what mixed precision, checkpointing, cuDNN's auto-tuner and accumulation buy on this workload",
        description=(
            "Apply each technique to the workload and measure it: the largest memory-safe batch, its "
            "memory and its throughput, against the baseline as given."
        ),
    )
    flags.add_workload(parser)
    parser.add_argument(
        "--techniques",
        default=None,
        help=(
            f"comma-separated settings, each one of {', '.join(TECHNIQUES)} or several joined with '+' "
            f"(amp+checkpointing), or accumulation; amp is bfloat16 where the device runs it, else float16 "
            f"with a GradScaler, as amp-fp16 always is; compile is torch.compile of the model, not among "
            f"the defaults (default: the usual ones for the device)"
        ),
    )
    flags.add_bounds(parser, flags.DEFAULT_MAX_HELP)
    parser.add_argument(
        "--global-batch-size", type=int, default=None, help="adds accumulation to reach this global batch"
    )
    parser.add_argument(
        "--checkpoint-module",
        default=None,
        help="the module type checkpointing wraps (default: the most repeated block)",
    )
    parser.add_argument(
        "--windows", type=int, default=3, help="timing windows at each largest batch (default: %(default)s)"
    )
    parser.add_argument(
        "--explore-seconds",
        type=float,
        default=10.0,
        help="explore's time for each technique's recommended batch; 0 skips it (default: %(default)s)",
    )
    flags.add_device(parser)
    flags.add_output(parser, ("text", "json", "csv"))
    flags.add_report(parser)
    return parser


def run(args: argparse.Namespace) -> int:
    return flags.run_launched(args, args.device, lambda: _run(args))


def _run(args: argparse.Namespace) -> int:
    def row_done(row: ComparisonRow) -> None:
        if row.applied and row.batch_size is not None:
            flags.say(f"{row.technique}: batch_size={row.batch_size} ({row.note}) in {row.seconds:.1f} s")
        else:
            flags.say(f"{row.technique}: {row.note}")

    techniques = None if args.techniques is None else args.techniques.split(",")
    workload = flags.workload(args)
    with flags.progress(args, "compare") as display:
        comparison = compare(
            workload,
            techniques,
            device=args.device,
            memory_limit=args.memory_limit,
            memory_fraction=args.memory_fraction,
            min_batch_size=args.min_batch_size,
            max_batch_size=args.max_batch_size,
            multiple_of=args.multiple_of,
            global_batch_size=args.global_batch_size,
            checkpoint_module=args.checkpoint_module,
            windows=args.windows,
            explore_seconds=args.explore_seconds,
            on_row=row_done,
            on_trial=display.trial,
        )
        flags.say(f"compared {len(comparison.rows)} settings in {comparison.seconds:.1f} s.")
    document = {**comparison.to_dict(), **flags.what_ran(workload.name)}
    flags.publish(args, document, text=comparison.table, csv=comparison.to_csv)
    return 0

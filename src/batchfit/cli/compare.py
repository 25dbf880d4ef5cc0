"""``batchfit compare``: what each technique buys on the workload (batch, memory, throughput)."""

from __future__ import annotations

import argparse
from typing import Any

import batchfit
from batchfit import BatchSizes, Timing, Where
from batchfit.cli import flags
from batchfit.policy.explore.techniques import TECHNIQUES


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
            f"comma-separated settings, each one of {', '.join(TECHNIQUES)} or several joined "
            "with '+' (amp+checkpointing), or accumulation; amp is bfloat16 where the device runs it, "
            "else float16 with a GradScaler, as amp-fp16 always is; compile is torch.compile of the "
            "model, not among the defaults (default: the usual ones for the device)"
        ),
    )
    flags.add_where(parser)
    flags.add_options(
        parser,
        BatchSizes,
        exclude=("world_size",),
        help={"global_batch_size": "adds accumulation to reach this global batch"},
    )
    flags.add_options(
        parser,
        flags.default_of(batchfit.compare, "timing"),
        help={
            "windows": "timing windows at each largest batch",
            "time_budget_seconds": "the whole comparison's time; 0: no bound and no explore per row",
        },
    )
    parser.add_argument(
        "--checkpoint-module",
        default=None,
        help="the module type checkpointing wraps (default: the most repeated block)",
    )
    flags.add_output(parser, ("text", "json", "csv"))
    return parser


def run(args: argparse.Namespace) -> int:
    where, sizes, timing = (
        flags.options(args, Where),
        flags.options(args, BatchSizes),
        flags.options(args, Timing),
    )
    return flags.run_launched(args, where, lambda: _run(args, where, sizes, timing))


def _run(args: argparse.Namespace, where: Where, sizes: BatchSizes, timing: Timing) -> int:
    techniques = None if args.techniques is None else args.techniques.split(",")
    workload = flags.workload(args, where)
    with flags.progress(args, "compare") as display:
        comparison = batchfit.compare(
            workload,
            techniques,
            where=where,
            sizes=sizes,
            timing=timing,
            checkpoint_module=args.checkpoint_module,
            on_progress=display.hear,
        )
        flags.say(f"compared {len(comparison.rows)} settings in {comparison.seconds:.1f} s.")
    document = flags.envelope(args, workload.name, [comparison])
    flags.publish(args, document, {"text": comparison.table, "csv": comparison.to_csv})
    return 0

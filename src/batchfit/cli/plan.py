"""``batchfit plan``: micro-batch, accumulation, learning rate and warm-up for a global batch."""

from __future__ import annotations

import argparse
from typing import Any

import batchfit
from batchfit import Baseline
from batchfit.cli import flags
from batchfit.policy.plan.plan_options import Scaling, TrainingFacts


def add_parser(commands: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = commands.add_parser(
        "plan",
        help="micro-batch, accumulation, learning rate and warm-up for a target global batch",
        description="Split a global batch over devices and scale the learning rate to it (no model is run).",
    )
    add = parser.add_argument
    add("--global-batch-size", type=int, required=True, help="the global batch to train with")
    add("--world-size", type=int, default=1, help="devices (default: %(default)s)")
    add("--max-micro-batch-size", type=int, default=None, help="the largest micro-batch that fits a device")
    add("--micro-batch-size", type=int, default=None, help="force this micro-batch")
    for options in (Baseline, Scaling, TrainingFacts):
        flags.add_options(parser, options)
    flags.add_output(parser, ("text", "json"))
    return parser


def run(args: argparse.Namespace) -> int:
    flags.check_report(args)
    result = batchfit.plan(
        args.global_batch_size,
        flags.options(args, Baseline),
        world_size=args.world_size,
        max_micro_batch_size=args.max_micro_batch_size,
        micro_batch_size=args.micro_batch_size,
        scaling=flags.options(args, Scaling),
        training=flags.options(args, TrainingFacts),
    )
    document = flags.envelope(args, None, [result])
    flags.publish(args, document, {"text": result.table})
    return 0

"""``batchfit plan``: micro-batch, accumulation, learning rate and warm-up for a global batch."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import batchfit
from batchfit.cli import flags
from batchfit.policy.plan import plan
from batchfit.policy.plan_options import Baseline, Scaling, TrainingFacts


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
    add(
        "--base-learning-rate", type=float, required=True, help="the learning rate tuned at --base-batch-size"
    )
    add("--base-batch-size", type=int, required=True, help="the batch size --base-learning-rate was tuned at")
    add("--scaling-rule", choices=("linear", "sqrt"), default="linear", help="(default: %(default)s)")
    add("--warmup-steps", type=int, default=None, help="default: recommended")
    add("--steps-per-epoch", type=int, default=None, help="optimizer steps per epoch (caps the warm-up)")
    add("--weight-decay", type=float, default=None, help="the weight decay at --base-batch-size")
    add("--scale-weight-decay", action="store_true", help="scale --weight-decay by sqrt(global / base)")
    add("--uses-batchnorm", action="store_true", help="the model uses BatchNorm")
    add("--uses-ema", action="store_true", help="the training keeps an EMA of the weights")
    add("--fine-tuning", action="store_true", help="fine-tuning a pre-trained model")
    add("--format", choices=("text", "json"), default="text", help="output format (default: %(default)s)")
    flags.add_report(parser)
    return parser


def run(args: argparse.Namespace) -> int:
    flags.check_report(args)
    result = plan(
        args.global_batch_size,
        Baseline(args.base_learning_rate, args.base_batch_size, weight_decay=args.weight_decay),
        world_size=args.world_size,
        max_micro_batch_size=args.max_micro_batch_size,
        micro_batch_size=args.micro_batch_size,
        scaling=Scaling(
            scaling_rule=args.scaling_rule,
            scale_weight_decay=args.scale_weight_decay,
            warmup_steps=args.warmup_steps,
            steps_per_epoch=args.steps_per_epoch,
        ),
        training=TrainingFacts(
            uses_batchnorm=args.uses_batchnorm, uses_ema=args.uses_ema, fine_tuning=args.fine_tuning
        ),
    )
    document = {
        **result.to_dict(),
        "batchfit_version": batchfit.__version__,
        "created_at": flags.created_at(),
    }
    sys.stdout.write((json.dumps(document, indent=2) if args.format == "json" else result.summary()) + "\n")
    flags.write_report(args, document)
    return 0

"""``batchfit check``: exit 1 when the workload no longer fits a batch size in a memory (for CI)."""

from __future__ import annotations

import argparse
from typing import Any

import batchfit
from batchfit import FitCheck, Trials, Where
from batchfit.cli import flags
from batchfit.policy.search.trial import Mode


def add_parser(commands: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = commands.add_parser(
        "check",
        help="fail (exit 1) when the workload no longer fits a batch size in a memory: for CI",
        description=(
            "Run the training step (and, with --eval-batch-size, the eval step) at the given batch "
            "size under a hard cap at --memory-fraction x the memory, and say the margin; exit 1 "
            "when it does not fit."
        ),
    )
    flags.add_workload(parser)
    parser.add_argument("--batch-size", type=int, required=True, help="the training batch that must fit")
    parser.add_argument(
        "--eval-batch-size", type=int, default=None, help="also the eval batch that must fit (default: none)"
    )
    flags.add_where(parser)
    flags.add_options(parser, Trials)
    flags.add_output(parser, ("text", "json"))
    return parser


def run(args: argparse.Namespace) -> int:
    where, trials = flags.options(args, Where), flags.options(args, Trials)
    return flags.run_launched(args, where, lambda: _run(args, where, trials))


def _run(args: argparse.Namespace, where: Where, trials: Trials) -> int:
    workload = flags.workload(args, where)
    asked: list[tuple[Mode, int]] = [("train", args.batch_size)]
    asked += [("eval", args.eval_batch_size)] if args.eval_batch_size else []
    checks: list[FitCheck] = []
    with flags.progress(args, "check", usual_steps=trials.steps_per_trial) as display:
        for mode, batch_size in asked:
            result = batchfit.check(
                workload, batch_size, mode, where=where, trials=trials, on_progress=display.hear
            )
            flags.say(result.summary())
            checks.append(result)
    document = flags.envelope(args, workload.name, checks)
    flags.publish(args, document, {"text": lambda: "".join(result.summary() + "\n" for result in checks)})
    return 0 if all(result.fits for result in checks) else 1

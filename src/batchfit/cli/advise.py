"""``batchfit advise``: find, explore, compare and check-data run on the workload, and what to
change, ranked by measured gain, with the plan for the batch it recommends."""

from __future__ import annotations

import argparse
import shlex
from typing import Any

import batchfit
from batchfit import Baseline, BatchSizes, ConfigurationError, Timing, Where
from batchfit.advice.advise import STEPS as ADVISE_STEPS
from batchfit.advice.advise import Checklist
from batchfit.cli import flags

STEPS = ", ".join(ADVISE_STEPS)


def add_parser(commands: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = commands.add_parser(
        "advise",
        help="the checklist, run: what to change to train bigger and faster, ranked by measured gain",
        description="Run find, explore, compare and check-data on the workload and say what to change.",
    )
    flags.add_workload(parser)
    parser.add_argument("--loader", metavar="MODULE:FUNCTION", help="a DataLoader factory for check-data")
    parser.add_argument("--skip", default="", help=f"comma-separated steps not to run, of {STEPS}")
    parser.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help="the batch to check data and plan at (default: explore's)",
    )
    parser.add_argument("--techniques", default=None, help="compare's settings (default: the usual ones)")
    parser.add_argument("--base-learning-rate", type=float, default=None, help="for the plan")
    parser.add_argument("--base-batch-size", type=int, default=None, help="the batch the base rate is for")
    parser.add_argument(
        "--noise-scale",
        type=float,
        default=None,
        help="the gradient noise scale in samples: goodput in explore, how far scaling pays in the plan",
    )
    flags.add_where(parser)
    flags.add_options(
        parser,
        BatchSizes,
        help={
            "global_batch_size": "the plan's global batch (default: the recommended batch x --world-size)",
            "world_size": "the plan's devices (default: 1)",
        },
    )
    flags.add_options(
        parser,
        flags.default_of(batchfit.advise, "timing"),
        help={"time_budget_seconds": "the whole checklist's time; 0: no bound"},
    )
    flags.add_output(parser, ("text", "json"))
    return parser


def run(args: argparse.Namespace) -> int:
    skip = tuple(step.strip() for step in args.skip.split(",") if step.strip())
    unknown = [step for step in skip if step not in ADVISE_STEPS]
    if unknown:
        raise ConfigurationError(f"--skip {args.skip!r}: the steps are {STEPS}.")
    techniques = None if args.techniques is None else tuple(args.techniques.split(","))
    checklist = Checklist(skip, args.batch_size, techniques, args.loader, args.noise_scale)
    if (args.base_learning_rate is None) != (args.base_batch_size is None):
        raise ConfigurationError(
            "plan needs both --base-learning-rate and --base-batch-size (the batch that learning rate "
            "was tuned for), or neither."
        )
    baseline = None
    if args.base_learning_rate is not None:
        baseline = Baseline(args.base_learning_rate, args.base_batch_size)
    where, sizes = flags.options(args, Where), flags.options(args, BatchSizes)
    timing = flags.options(args, Timing)
    return flags.run_launched(args, where, lambda: _run(args, where, sizes, timing, checklist, baseline))


def _run(
    args: argparse.Namespace,
    where: Where,
    sizes: BatchSizes,
    timing: Timing,
    checklist: Checklist,
    baseline: Baseline | None,
) -> int:
    workload = flags.workload(args, where)
    with flags.progress(args, "advise") as display:
        result = batchfit.advise(
            workload,
            where=where,
            sizes=sizes,
            timing=timing,
            checklist=checklist,
            baseline=baseline,
            on_progress=display.hear,
        )
        flags.say(f"advise: done in {result.seconds:.1f} s.")
    context = _context(args)
    document = flags.envelope(args, workload.name, [result], context=context)
    flags.publish(args, document, {"text": lambda: result.table(context)})
    return 0


def _context(args: argparse.Namespace) -> str:
    """The flags that name the workload and the device, for the evidence commands."""
    words = ["--example", args.example] if args.example else ["--workload", args.workload]
    for flag, value in (("--device", args.device), ("--memory-limit", args.memory_limit)):
        if value is not None:
            words += [flag, value]
    return shlex.join(words)

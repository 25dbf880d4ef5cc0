"""``batchfit advise``: find, explore, compare and check-data run on the workload, and what to
change, ranked by measured gain, with the plan for the batch it recommends."""

from __future__ import annotations

import argparse
import shlex
from typing import Any

from batchfit.advise import STEPS, advise
from batchfit.cli import flags
from batchfit.errors import ConfigurationError
from batchfit.runtime.workloads.specs import load_function


def add_parser(commands: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = commands.add_parser(
        "advise",
        help="the checklist, run: what to change to train bigger and faster, ranked by measured gain",
        description="Run find, explore, compare and check-data on the workload and say what to change.",
    )
    flags.add_workload(parser)
    parser.add_argument("--loader", metavar="MODULE:FUNCTION", help="a DataLoader factory for check-data")
    parser.add_argument("--skip", default="", help=f"comma-separated steps not to run, of {', '.join(STEPS)}")
    parser.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help="the batch to check data and plan at (default: explore's)",
    )
    parser.add_argument(
        "--explore-seconds", type=float, default=10.0, help="explore's time (default: %(default)s)"
    )
    parser.add_argument("--techniques", default=None, help="compare's settings (default: the usual ones)")
    parser.add_argument(
        "--memory-fraction", type=float, default=0.8, help="share of device memory (default: %(default)s)"
    )
    parser.add_argument("--global-batch-size", type=int, default=None, help="the plan's global batch")
    parser.add_argument("--world-size", type=int, default=1, help="the plan's devices (default: 1)")
    parser.add_argument("--base-learning-rate", type=float, default=None, help="for the plan")
    parser.add_argument("--base-batch-size", type=int, default=None, help="the batch the base rate is for")
    flags.add_device(parser)
    flags.add_output(parser, ("text", "json"))
    flags.add_report(parser)
    return parser


def run(args: argparse.Namespace) -> int:
    skip = [step.strip() for step in args.skip.split(",") if step.strip()]
    unknown = [step for step in skip if step not in STEPS]
    if unknown:
        raise ConfigurationError(f"--skip {args.skip!r}: the steps are {', '.join(STEPS)}.")
    return flags.run_launched(args, args.device, lambda: _run(args, skip))


def _run(args: argparse.Namespace, skip: list[str]) -> int:
    loader = None if args.loader is None else load_function(args.loader, "--loader")
    workload = flags.workload(args)
    display = flags.progress(args, "advise")

    def step(name: str) -> None:
        flags.say(f"advise: {name}...")
        display.start(name)

    with display:
        result = advise(
            workload,
            device=args.device,
            memory_limit=args.memory_limit,
            memory_fraction=args.memory_fraction,
            skip=skip,
            batch_size=args.batch_size,
            explore_seconds=args.explore_seconds,
            techniques=None if args.techniques is None else args.techniques.split(","),
            loader=loader,
            global_batch_size=args.global_batch_size,
            world_size=args.world_size,
            base_learning_rate=args.base_learning_rate,
            base_batch_size=args.base_batch_size,
            on_step=step,
            on_trial=display.trial,
        )
        flags.say(f"advise: done in {result.seconds:.1f} s.")
    document = {**result.to_dict(), **flags.what_ran(workload.name), "context": _context(args)}
    flags.publish(args, document, text=lambda: result.report(_context(args)))
    return 0


def _context(args: argparse.Namespace) -> str:
    """The flags that name the workload and the device, for the evidence commands."""
    words = ["--example", args.example] if args.example else ["--workload", args.workload]
    for flag, value in (("--device", args.device), ("--memory-limit", args.memory_limit)):
        if value is not None:
            words += [flag, value]
    return shlex.join(words)

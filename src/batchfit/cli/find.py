"""``batchfit find``: the largest memory-safe batch size for training and evaluation."""

from __future__ import annotations

import argparse
import functools
import json
from typing import Any

from batchfit.checks import DEFAULT_MAX_BATCH_SIZE, default_max_batch_size
from batchfit.cli import flags
from batchfit.find import SearchResult, find_batch_size
from batchfit.policy.search import Candidates
from batchfit.policy.trial import Mode


def add_parser(commands: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = commands.add_parser(
        "find",
        help="the largest memory-safe batch size for training and evaluation",
        description="Find the largest batch whose train (and eval) step fits a fraction of device memory.",
    )
    flags.add_workload(parser)
    parser.add_argument(
        "--modes", default="train,eval", help="comma-separated: train, eval (default: %(default)s)"
    )
    flags.add_bounds(parser, flags.DEFAULT_MAX_HELP)
    parser.add_argument(
        "--steps-per-trial", type=int, default=2, help="steps per trial (default: %(default)s)"
    )
    parser.add_argument(
        "--confirm-steps",
        type=int,
        default=None,
        help=(
            "steps the answer trains before it is final, and every trial after the first that "
            "fails (default: 10 on CUDA, none on the CPU)"
        ),
    )
    flags.add_device(parser)
    flags.add_output(parser, ("text", "json"))
    flags.add_report(parser)
    return parser


def run(args: argparse.Namespace) -> int:
    modes = flags.parse_modes(args.modes)
    train_max = DEFAULT_MAX_BATCH_SIZE if args.max_batch_size is None else args.max_batch_size
    Candidates.between(args.min_batch_size, train_max, args.multiple_of)  # bad bounds fail before any work
    return flags.run_launched(args, args.device, lambda: _run(args, modes, train_max))


def _run(args: argparse.Namespace, modes: list[Mode], train_max: int) -> int:
    workload = flags.workload(args)
    results = []
    with flags.progress(args, "find") as display:
        for mode in modes:
            result = find_batch_size(
                workload,
                mode,
                device=args.device,
                memory_limit=args.memory_limit,
                memory_fraction=args.memory_fraction,
                min_batch_size=args.min_batch_size,
                max_batch_size=default_max_batch_size(mode, train_max),
                multiple_of=args.multiple_of,
                steps_per_trial=args.steps_per_trial,
                confirm_steps=args.confirm_steps,
                on_trial=functools.partial(display.trial, mode, usual_steps=args.steps_per_trial),
                on_trial_start=functools.partial(display.start, mode),
            )
            flags.say(result.summary())
            results.append(result)
    document = {**flags.what_ran(workload.name), "results": [result.to_dict() for result in results]}
    flags.emit(_render(document, results, args.format), args.output)
    flags.write_report(args, json.loads(json.dumps(document)))
    return 0


def _render(document: dict[str, Any], results: list[SearchResult], output_format: str) -> str:
    if output_format == "json":
        return json.dumps(document, indent=2) + "\n"
    answers = [f"{result.mode}_batch_size: {result.batch_size}" for result in results]
    return "\n".join([*answers, "", *(result.summary() for result in results)]) + "\n"

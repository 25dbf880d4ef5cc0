"""``batchfit find``: the largest memory-safe batch size for training and evaluation."""

from __future__ import annotations

import argparse
from typing import Any

import batchfit
from batchfit import BatchSizes, SearchResult, Trials, Where
from batchfit.cli import flags
from batchfit.policy.search.trial import Mode

FORMATS = ("text", "json")


def add_parser(commands: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = commands.add_parser(
        "find",
        help="the largest memory-safe batch size for training and evaluation",
        description="Find the largest batch whose train (and eval) step fits a fraction of device memory.",
    )
    flags.add_workload(parser)
    flags.add_modes(parser)
    flags.add_where(parser)
    flags.add_options(parser, BatchSizes, exclude=("global_batch_size", "world_size"))
    flags.add_options(parser, Trials)
    parser.add_argument(
        "--start-from",
        default=None,
        metavar="PREDICTION.json",
        help="start from a saved prediction (batchfit predict --format json --output FILE): its "
        "allocator records, replayed at this budget, place the first trial (on cuda)",
    )
    flags.add_output(parser, FORMATS)
    return parser


def run(args: argparse.Namespace) -> int:
    modes = flags.parse_modes(args.modes)
    where = flags.options(args, Where)
    sizes = flags.options(args, BatchSizes)  # bad bounds fail here, before any work
    trials = flags.options(args, Trials)
    return flags.run_launched(args, where, lambda: _run(args, where, modes, sizes, trials))


def _run(args: argparse.Namespace, where: Where, modes: list[Mode], sizes: BatchSizes, trials: Trials) -> int:
    workload = flags.workload(args, where)
    results = []
    with flags.progress(args, "find", usual_steps=trials.steps_per_trial) as display:
        for mode in modes:
            result = batchfit.find_batch_size(
                workload,
                mode,
                where=where,
                sizes=sizes.for_mode(mode),
                trials=trials,
                on_progress=display.hear,
                start_from=args.start_from,
            )
            flags.say(result.summary())
            results.append(result)
    document = flags.envelope(args, workload.name, results)
    flags.publish(args, document, {"text": lambda: _text(results)})
    return 0


def _text(results: list[SearchResult]) -> str:
    answers = [f"{result.mode}_batch_size: {result.batch_size}" for result in results]
    return "\n".join([*answers, "", *(result.summary() for result in results)]) + "\n"

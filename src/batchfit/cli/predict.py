"""``batchfit predict``: the largest train and eval batch on GPUs of other sizes."""

from __future__ import annotations

import argparse
from typing import Any

import batchfit
from batchfit import BatchSizes, Targets, Trials, Where
from batchfit.cli import flags

FORMATS = ("text", "json")


def add_parser(commands: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = commands.add_parser(
        "predict",
        help="the largest batch on GPUs you do not have, from small trials here",
        description="Record a few small trials' allocator requests (on a GPU, or on the CPU with CUDA's "
        "allocator modelled) and replay them at each target GPU's memory.",
    )
    flags.add_workload(parser)
    flags.add_modes(parser)
    flags.add_options(parser, Where)
    flags.add_options(parser, Targets)
    flags.add_options(parser, BatchSizes, exclude=("global_batch_size", "world_size"))
    flags.add_options(parser, Trials)
    flags.add_output(parser, FORMATS)
    return parser


def run(args: argparse.Namespace) -> int:
    flags.check_report(args)
    modes = flags.parse_modes(args.modes)
    where = flags.options(args, Where)
    targets = flags.options(args, Targets)  # unknown cards and bad sizes fail here, before any work
    sizes = flags.options(args, BatchSizes)
    trials = flags.options(args, Trials)
    workload = flags.workload(args, where)
    result = batchfit.predict(
        workload,
        targets,
        modes=modes,
        where=where,
        sizes=sizes,
        trials=trials,
    )
    flags.say(result.summary())
    document = flags.envelope(args, workload.name, [result])
    flags.publish(args, document, {"text": result.table})
    return 0

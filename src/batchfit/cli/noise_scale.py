"""``batchfit noise-scale``: the gradient noise scale of the workload's training step."""

from __future__ import annotations

import argparse
from typing import Any

import batchfit
from batchfit import Sampling, Where
from batchfit.cli import flags


def add_parser(commands: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = commands.add_parser(
        "noise-scale",
        help="the gradient noise scale B_simple: the batch above which steps stop shrinking in proportion",
        description=(
            "Train the workload's step for --steps optimizer steps, read its micro-batches' gradients "
            "against their accumulated batch (under torchrun: each rank's against the all-reduced), and "
            "estimate the simple noise scale; the model's state is put back after."
        ),
    )
    flags.add_workload(parser)
    flags.add_where(parser)
    flags.add_options(parser, Sampling)
    flags.add_output(parser, ("text", "json"))
    return parser


def run(args: argparse.Namespace) -> int:
    where, sampling = flags.options(args, Where), flags.options(args, Sampling)
    return flags.run_launched(args, where, lambda: _run(args, where, sampling))


def _run(args: argparse.Namespace, where: Where, sampling: Sampling) -> int:
    workload = flags.workload(args, where)
    with flags.progress(args, "noise-scale", noun="steps") as display:
        result = batchfit.noise_scale(workload, sampling=sampling, where=where, on_progress=display.hear)
        flags.say(f"{result.summary()} ({result.seconds:.1f} s).")
    document = flags.envelope(args, workload.name, [result])
    flags.publish(args, document, {"text": result.table})
    return 0

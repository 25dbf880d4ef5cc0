"""The ``batchfit`` command line: parse, call the public API, render. One module per subcommand,
each with ``add_parser`` (its flags) and ``run`` (the call); the flags they share are in ``flags``."""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Sequence

import batchfit
from batchfit import BatchfitError, ConfigurationError, RankFailedError
from batchfit.cli import advise, analyze, check, check_data, compare, explore, find, plan, report
from batchfit.cli.launch import exit_launched, launched_world_size

DEBUG_VARIABLE = "BATCHFIT_DEBUG"


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(
        prog="batchfit", description="Find the batch size to train and evaluate with on this hardware."
    )
    root.add_argument("--version", action="version", version=f"batchfit {batchfit.__version__}")
    commands = root.add_subparsers(dest="command", required=True)
    for command in (find, explore, compare, check_data, advise, analyze, plan, check, report):
        command.add_parser(commands).set_defaults(run=command.run)
    return root


def main(argv: Sequence[str] | None = None) -> int:
    code = _main(argv)
    try:
        launched = launched_world_size() > 1
    except ConfigurationError:  # a WORLD_SIZE that is no number: the command said so already
        launched = False
    if launched:  # one of several ranks: leave without the C++ teardown
        exit_launched(code)
    return code


def _main(argv: Sequence[str] | None) -> int:
    args = parser().parse_args(argv)
    debug = os.environ.get(DEBUG_VARIABLE, "").strip().lower() not in ("", "0", "false", "no")
    try:
        return int(args.run(args))
    except (BatchfitError, OSError) as error:
        if isinstance(error, RankFailedError) and not _speaks(args):
            return 1  # rank 0 names the rank that failed, and its error
        if debug:
            traceback.print_exc()
        print(f"batchfit: error: {error}", file=sys.stderr)
        if not debug:
            print(f"(set {DEBUG_VARIABLE}=1 to see the traceback)", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("batchfit: interrupted; the model and optimizer were left as they were.", file=sys.stderr)
        return 130


def _speaks(args: argparse.Namespace) -> bool:
    """Whether this process prints: alone, rank 0 of a torchrun job, or every rank with --all-ranks."""
    return bool(getattr(args, "all_ranks", False)) or os.environ.get("RANK", "0") == "0"

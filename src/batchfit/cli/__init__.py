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
from batchfit.cli import (
    advise,
    analyze,
    check,
    check_data,
    compare,
    explore,
    find,
    noise_scale,
    plan,
    predict,
    report,
)
from batchfit.cli.launch import exit_launched, launched_world_size

DEBUG_VARIABLE = "BATCHFIT_DEBUG"


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(
        prog="batchfit", description="Find the batch size to train and evaluate with on this hardware."
    )
    root.add_argument("--version", action="version", version=f"batchfit {batchfit.__version__}")
    commands = root.add_subparsers(dest="command", required=True)
    for command in (
        find,
        explore,
        compare,
        check_data,
        advise,
        analyze,
        plan,
        predict,
        noise_scale,
        check,
        report,
    ):
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
    except KeyboardInterrupt:
        print("batchfit: interrupted; the model and optimizer were left as they were.", file=sys.stderr)
        return 130
    except Exception as error:
        if not isinstance(error, BatchfitError) and _raised_by_user_code(error):
            _print_user_traceback(error, debug)
            return 1
        if not isinstance(error, (BatchfitError, OSError)):
            raise
        if isinstance(error, RankFailedError) and not _speaks(args):
            return 1  # rank 0 names the rank that failed, and its error
        if debug:
            traceback.print_exc()
        print(f"batchfit: error: {error}", file=sys.stderr)
        if not debug:
            print(f"(set {DEBUG_VARIABLE}=1 to see the traceback)", file=sys.stderr)
        return 1


#: How batchfit's note on an error of the user's own code begins: ``raised by the train step at
#: batch_size=N, step S of M.`` (a trial's step), or by the user's loader (check-data).
RAISED_BY = "batchfit: raised by "
#: Where batchfit's own frames are: left out of the traceback of an error the user's code raised.
PACKAGE = os.path.dirname(os.path.abspath(batchfit.__file__)) + os.sep


def _raised_by_user_code(error: BaseException) -> bool:
    """Whether ``error`` was raised inside the user's step (batchfit's note says so) by code that is
    not batchfit's (its innermost frame: else it is batchfit's own, shown whole)."""
    noted = any(str(note).startswith(RAISED_BY) for note in getattr(error, "__notes__", ()))
    innermost = error.__traceback__
    while innermost is not None and innermost.tb_next is not None:
        innermost = innermost.tb_next
    return noted and innermost is not None and not _is_batchfit(innermost.tb_frame.f_code.co_filename)


def _is_batchfit(filename: str) -> bool:
    return os.path.abspath(filename).startswith(PACKAGE)


def _print_user_traceback(error: BaseException, debug: bool) -> None:
    """The traceback of an error raised inside the user's step (or loader), as the user's own code
    shows it: batchfit's frames left out (all of them under ``BATCHFIT_DEBUG``), and the note that
    names the batch size and the step."""
    shown = traceback.TracebackException.from_exception(error)
    if not debug:
        _leave_out_batchfit(shown)
    print("".join(shown.format()), end="", file=sys.stderr)
    if not debug:
        print(f"(batchfit's own frames are left out; set {DEBUG_VARIABLE}=1 to see them)", file=sys.stderr)


def _leave_out_batchfit(shown: traceback.TracebackException) -> None:
    """``shown``'s frames, and those of the errors it was raised from, without batchfit's."""
    seen: set[int] = set()
    todo: list[traceback.TracebackException | None] = [shown]
    while todo:
        each = todo.pop()
        if each is None or id(each) in seen:
            continue
        seen.add(id(each))
        frames = [frame for frame in each.stack if not _is_batchfit(frame.filename)]
        each.stack = traceback.StackSummary.from_list(frames)
        todo += [each.__cause__, each.__context__]


def _speaks(args: argparse.Namespace) -> bool:
    """Whether this process prints: alone, rank 0 of a torchrun job, or every rank with --all-ranks."""
    return bool(getattr(args, "all_ranks", False)) or os.environ.get("RANK", "0") == "0"

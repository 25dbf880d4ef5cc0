"""The ``batchfit`` command line: parse, call the public API, render. One module per subcommand,
each with ``add_parser`` (its flags) and ``run`` (the call); the flags they share are in ``flags``.
Exit codes, as CI reads them: 0 ok, 1 a negative answer or a failed run, 2 a usage or configuration
error (``exit_code``; ``--help`` says so: ``exit_status``)."""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Sequence

import batchfit
from batchfit import BatchfitError, ConfigurationError
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
from batchfit.errors import DeviceUnavailableError, RankFailedError

DEBUG_VARIABLE = "BATCHFIT_DEBUG"
#: The exit codes: the command's answer is yes (or it ran), no (or its run failed), or it could not
#: start as asked (argparse's own usage errors exit 2 too).
OK, NEGATIVE, USAGE = 0, 1, 2
#: Each command's negative answer (exit 1), where it has one besides a failed run.
NEGATIVE_ANSWER = {
    "check": "a batch size does not fit",
    "find": "not even --min-batch-size fits",
}


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
        sub = command.add_parser(commands)
        sub.epilog = exit_status(sub.prog.split()[-1])
        sub.set_defaults(run=command.run)
    root.epilog = exit_status(None)
    return root


def exit_status(command: str | None) -> str:
    """What ``--help`` says of the exit codes, for ``command`` (None: every command)."""
    negative = NEGATIVE_ANSWER.get(command or "", "")
    if command is None:
        negative = f"check: a batch size does not fit; find: {NEGATIVE_ANSWER['find']}; any command: "
    elif negative:
        negative += ", or "
    return (
        f"exit status: 0 ok; 1 {negative}the run failed (an error raised by the workload's own "
        f"code, a loss that is not finite, a result that could not be written); 2 a usage or "
        f"configuration error: a bad flag or value, a --workload that cannot be imported or found, "
        f"a device that is not there. Set {DEBUG_VARIABLE}=1 to see the traceback."
    )


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
            return NEGATIVE
        if not isinstance(error, (BatchfitError, OSError)):
            raise
        if isinstance(error, RankFailedError) and not _speaks(args):
            return NEGATIVE  # rank 0 names the rank that failed, and its error
        if debug:
            traceback.print_exc()
        print(f"batchfit: error: {error}", file=sys.stderr)
        if not debug:
            print(f"(set {DEBUG_VARIABLE}=1 to see the traceback)", file=sys.stderr)
        return exit_code(error)


def exit_code(error: BaseException) -> int:
    """2 for an error in what was asked (a flag, a value, the workload spec, a device that is not
    there), which no run can fix; 1 for a run that failed (out of memory at the smallest size, a
    loss that is not finite, a file that could not be written)."""
    return USAGE if isinstance(error, (ConfigurationError, DeviceUnavailableError)) else NEGATIVE


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

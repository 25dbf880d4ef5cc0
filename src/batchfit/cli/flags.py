"""The flags several subcommands share, defined once, and the output they share: messages and
progress on stderr, the result on stdout or in ``--output``. A flag is its parameter's name with dashes."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

from batchfit.checks import DEFAULT_MAX_BATCH_SIZE
from batchfit.cli.progress import Display
from batchfit.errors import ConfigurationError
from batchfit.policy.trial import Mode
from batchfit.runtime.distributed.launch import launched_process_group, launched_world_size
from batchfit.runtime.workloads.examples import EXAMPLES
from batchfit.runtime.workloads.specs import example_as_trained, load_workload
from batchfit.runtime.workloads.workload import Workload


def add_workload(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--example", choices=sorted(EXAMPLES), help="a built-in workload")
    source.add_argument(
        "--workload", metavar="MODULE:FUNCTION", help="a function returning a batchfit.Workload"
    )


def add_device(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--device", default=None, help="cpu, cuda or cuda:N (default: cuda if available, else cpu)"
    )
    parser.add_argument(
        "--memory-limit",
        default=None,
        help="a capacity such as 2GiB: the device's memory is capped there (a smaller GPU, or a CPU as one)",
    )
    add_ranks(parser)


def add_ranks(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--all-ranks",
        action="store_true",
        help="under torchrun, every rank prints its trials and result (default: rank 0 alone)",
    )


def add_bounds(parser: argparse.ArgumentParser, max_help: str) -> None:
    parser.add_argument(
        "--memory-fraction",
        type=float,
        default=0.8,
        help="share of device memory a batch may use (default: %(default)s)",
    )
    parser.add_argument("--min-batch-size", type=int, default=1, help="lower bound (default: %(default)s)")
    parser.add_argument("--max-batch-size", type=int, default=None, help=max_help)
    parser.add_argument(
        "--multiple-of", type=int, default=None, help="only batch sizes that are multiples of N"
    )


def add_output(parser: argparse.ArgumentParser, formats: tuple[str, ...]) -> None:
    parser.add_argument(
        "--format", choices=formats, default="text", help="output format (default: %(default)s)"
    )
    parser.add_argument(
        "--output", type=Path, default=None, help="write the result to this file instead of stdout"
    )


def add_report(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--report",
        type=Path,
        default=None,
        metavar="FILE.html",
        help="also write the result as an HTML report with plots (needs: pip install 'batchfit[report]')",
    )


def check_report(args: argparse.Namespace) -> None:
    """With ``--report``, fail before any work when the plotting extra is missing."""
    if args.report is not None:
        from batchfit.report import require_matplotlib

        require_matplotlib()


def run_launched(args: argparse.Namespace, device: str | None, body: Callable[[], int]) -> int:
    """A command's work: ``--report``'s extra checked before any, then ``body`` on every rank
    under torchrun (rank 0 alone speaking), or in this process."""
    check_report(args)
    with launched(args, device):
        return body()


def write_report(args: argparse.Namespace, document: Mapping[str, Any]) -> None:
    """With ``--report``, the HTML page of this command's JSON document."""
    if args.report is not None:
        from batchfit.report import SavedResult, recognise, write_report

        write_report([SavedResult(recognise(document), document, args.command)], args.report)


def publish(args: argparse.Namespace, document: Mapping[str, Any], **renders: Callable[[], str]) -> None:
    """The command's result in ``--format`` (json: ``document`` itself; the others: ``renders``) to
    stdout or ``--output``, then, with ``--report``, its HTML page."""
    render = renders.get(args.format, lambda: json.dumps(document, indent=2) + "\n")
    emit(render(), args.output)
    write_report(args, document)


def created_at() -> str:
    """Now, in UTC, as the JSON documents record when a result was made."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def what_ran(workload_name: str | None) -> dict[str, Any]:
    """What a JSON document records beside its result, so that a report can say what ran."""
    import torch

    import batchfit

    return {
        "workload": workload_name,
        "batchfit_version": batchfit.__version__,
        "torch_version": torch.__version__,
        "created_at": created_at(),
    }


DEFAULT_MAX_HELP = f"upper bound for train (default: {DEFAULT_MAX_BATCH_SIZE}); eval's is twice it"


def workload(args: argparse.Namespace) -> Workload:
    """The workload, built on the device the command runs on (--device, else cuda if available)."""
    if args.example:
        return example_as_trained(args.example, args.device)
    return load_workload(args.workload, device=args.device, source="--workload")


@contextmanager
def launched(args: argparse.Namespace, device: str | None) -> Iterator[None]:
    """Under torchrun, the command runs on every rank in one process group (the search in
    lockstep); rank 0 alone prints and writes ``--output``, unless ``--all-ranks``."""
    with launched_process_group(device) as rank:
        if rank in (None, 0) or args.all_ranks:
            yield
            return
        args.output = None
        if hasattr(args, "report"):
            args.report = None
        with open(os.devnull, "w") as sink, redirect_stdout(sink), redirect_stderr(sink):
            yield


def parse_modes(text: str) -> list[Mode]:
    modes = [mode.strip() for mode in text.split(",") if mode.strip()]
    aliases: dict[str, Mode] = {"train": "train", "eval": "eval", "val": "eval"}
    unknown = [mode for mode in modes if mode not in aliases]
    if unknown or not modes:
        raise ConfigurationError(f"--modes {text!r}: use a comma-separated list of train and eval (or val).")
    return [aliases[mode] for mode in dict.fromkeys(modes)]


def emit(text: str, output: Path | None) -> None:
    """The result to ``--output`` (saying so on stderr) or to stdout."""
    if output is not None:
        output.write_text(text)
        print(f"batchfit: wrote {output}", file=sys.stderr)
    else:
        sys.stdout.write(text)


def say(text: str) -> None:
    print(f"batchfit: {text}", file=sys.stderr, flush=True)


def progress(args: argparse.Namespace, command: str, noun: str = "trials") -> Display:
    """The trial lines and, on a terminal, the live line; under torchrun with ``--all-ranks`` the
    ranks share one terminal, so each prints its lines alone."""
    several = args.all_ranks and launched_world_size() > 1
    return Display(command, noun=noun, live=not several)

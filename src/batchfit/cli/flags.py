"""What the subcommands share: flags generated from the options' fields (so a flag is its field's
name with dashes and says what its field says), the workload and output flags, and the one way a
result is written: ``--format`` to stdout or ``--output``, then ``--report``'s page."""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import inspect
import json
import os
import sys
import types
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any, TypeVar

import torch

import batchfit
from batchfit import ConfigurationError, Result, Where, Workload
from batchfit.cli.launch import launched_process_group, launched_world_size
from batchfit.cli.progress import Display
from batchfit.policy.search.trial import Mode

T = TypeVar("T")


def add_options(
    parser: argparse.ArgumentParser,
    options: Any,
    *,
    exclude: tuple[str, ...] = (),
    help: Mapping[str, str] | None = None,
) -> None:
    """One flag per field of ``options`` (an options class, or an instance whose values are this
    command's defaults), its help the field's own unless ``help`` names the field."""
    kind = options if isinstance(options, type) else type(options)
    # The options name torch and NoiseScale in their annotations alone (they import neither).
    hints = typing.get_type_hints(kind, localns={"torch": torch, "NoiseScale": batchfit.NoiseScale})
    for field in dataclasses.fields(kind):
        if field.name in exclude or not field.init or not field.metadata.get("cli", True):
            continue
        default = getattr(options, field.name) if not isinstance(options, type) else field.default
        text = (help or {}).get(field.name, field.metadata["help"])
        flag = "--" + field.name.replace("_", "-")
        if default is dataclasses.MISSING:
            parser.add_argument(flag, required=True, help=text, **_argument(hints[field.name], None))
            continue
        if default not in (None, False) and "default:" not in text:
            text += " (default: %(default)s)"
        parser.add_argument(flag, default=default, help=text, **_argument(hints[field.name], default))


def _argument(hint: Any, default: Any) -> dict[str, Any]:
    """What argparse needs to read a field of type ``hint``."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        parts = [part for part in typing.get_args(hint) if part is not type(None)]
        hint = str if str in parts else parts[0]
    if hint is bool:
        return {"action": argparse.BooleanOptionalAction if default else "store_true"}
    if typing.get_origin(hint) is typing.Literal:
        return {"choices": typing.get_args(hint)}
    return {"type": hint}


def default_of(function: Callable[..., Any], parameter: str) -> Any:
    """The default of ``function``'s ``parameter``: a verb's own options, for its flags' defaults."""
    return inspect.signature(function).parameters[parameter].default


def options(args: argparse.Namespace, kind: type[T], **given: Any) -> T:
    """The ``kind`` options from the parsed flags (and ``given``), validated as they are made."""
    names = [field.name for field in dataclasses.fields(kind) if field.init]  # type: ignore[arg-type]
    values = {name: getattr(args, name) for name in names if hasattr(args, name)}
    return kind(**{**values, **given})


def add_workload(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--example", choices=batchfit.EXAMPLES, help="a built-in workload")
    source.add_argument(
        "--workload", metavar="MODULE:FUNCTION", help="a function returning a batchfit.Workload"
    )


def add_where(parser: argparse.ArgumentParser, *, memory: bool = True) -> None:
    """--device, and with ``memory`` --memory-limit and --memory-fraction; then --all-ranks."""
    add_options(parser, Where, exclude=() if memory else ("memory_limit", "memory_fraction"))
    add_ranks(parser)


def add_ranks(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--all-ranks",
        action="store_true",
        help="under torchrun, every rank prints its trials and result (default: rank 0 alone)",
    )


def add_modes(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--modes",
        default="train,eval",
        help="comma-separated: train, eval (or val) (default: %(default)s)",
    )


def parse_modes(text: str) -> list[Mode]:
    """The modes named in ``--modes``, each once (``val`` is ``eval``); an error names the flag."""
    modes = [mode.strip() for mode in text.split(",") if mode.strip()]
    if not modes or any(mode not in ("train", "eval", "val") for mode in modes):
        raise ConfigurationError(f"--modes {text!r}: use a comma-separated list of train and eval (or val).")
    named = ["eval" if mode == "val" else mode for mode in modes]
    return [typing.cast(Mode, mode) for mode in dict.fromkeys(named)]


def add_output(parser: argparse.ArgumentParser, formats: tuple[str, ...]) -> None:
    """--format, --output and --report. The format defaults to the one --output's suffix names."""
    parser.add_argument(
        "--format",
        choices=formats,
        default=None,
        help="output format (default: the one --output's suffix names, else text)",
    )
    parser.add_argument(
        "--output", type=Path, default=None, help="write the result to this file instead of stdout"
    )
    parser.add_argument(
        "--report",
        type=Path,
        default=None,
        metavar="FILE.html",
        help="also write the result as an HTML report with plots (needs: pip install 'batchfit[report]')",
    )


def output_format(args: argparse.Namespace, formats: tuple[str, ...]) -> str:
    """``--format``, else the format ``--output``'s suffix names, else text."""
    if args.format is not None:
        return str(args.format)
    suffix = "" if args.output is None else args.output.suffix.lower().lstrip(".")
    return suffix if suffix in formats else "text"


def check_report(args: argparse.Namespace) -> None:
    """Before any work: with ``--report``, the plotting extra is installed, and the folders
    ``--output`` and ``--report`` write into exist (else a ConfigurationError: exit 2)."""
    if getattr(args, "report", None) is not None:
        from batchfit.report import require_matplotlib

        require_matplotlib()
    for flag in ("output", "report"):
        check_folder(f"--{flag}", getattr(args, flag, None))


def check_folder(flag: str, path: Path | None) -> None:
    """A ConfigurationError where the folder ``path`` is to be written into does not exist."""
    if path is not None and not path.parent.is_dir():
        raise ConfigurationError(
            f"{flag} {path}: the folder {path.parent} does not exist; create it first "
            f"(mkdir -p {path.parent}) or write elsewhere."
        )


def run_launched(args: argparse.Namespace, where: Where, body: Callable[[], int]) -> int:
    """A command's work: ``--report``'s extra checked before any, then ``body`` on every rank
    under torchrun (rank 0 alone speaking), or in this process."""
    check_report(args)
    with launched(args, where):
        return body()


def publish(
    args: argparse.Namespace, document: Mapping[str, Any], renders: Mapping[str, Callable[[], str]]
) -> None:
    """The result in its format (json: ``document`` itself; the others: ``renders``) to stdout
    or ``--output``, then, with ``--report``, its HTML page."""
    chosen = output_format(args, ("json", *renders))
    text = renders[chosen]() if chosen in renders else json.dumps(document, indent=2) + "\n"
    emit(text, args.output)
    if getattr(args, "report", None) is not None:
        from batchfit.report import saved_result, write_report

        plain = json.loads(json.dumps(document))
        write_report([saved_result(plain, args.command)], args.report)


def created_at() -> str:
    """Now, in UTC, as the JSON documents record when a result was made."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def envelope(
    args: argparse.Namespace, workload_name: str | None, results: Sequence[Result], **extras: Any
) -> dict[str, Any]:
    """The one JSON document every command writes: the command, the versions, the workload (None
    for plan), when, what the command adds (``extras``), and its ``results``, always a list, each
    as its ``to_dict`` gives it."""
    dicts = [result.to_dict() for result in results]
    return {
        "command": args.command,
        "versions": dicts[0]["versions"] if dicts else None,
        "workload": workload_name,
        "created_at": created_at(),
        **extras,
        "results": dicts,
    }


def workload(args: argparse.Namespace, where: Where) -> Workload:
    """The workload, built on the device the command runs on."""
    if args.example:
        return batchfit.load_workload(f"example:{args.example}", device=where.device)
    return batchfit.load_workload(args.workload, device=where.device, source="--workload")


@contextmanager
def launched(args: argparse.Namespace, where: Where) -> Iterator[None]:
    """Under torchrun, the command runs on every rank in one process group (the search in
    lockstep); rank 0 alone prints and writes ``--output``, unless ``--all-ranks``."""
    with launched_process_group(where) as rank:
        if rank in (None, 0) or args.all_ranks:
            yield
            return
        args.output = None
        if hasattr(args, "report"):
            args.report = None
        with open(os.devnull, "w") as sink, redirect_stdout(sink), redirect_stderr(sink):
            yield


def emit(text: str, output: Path | None) -> None:
    """The result to ``--output`` (saying so on stderr) or to stdout."""
    if output is not None:
        output.write_text(text)
        print(f"batchfit: wrote {output}", file=sys.stderr)
    else:
        sys.stdout.write(text)


def say(text: str) -> None:
    print(f"batchfit: {text}", file=sys.stderr, flush=True)


def progress(args: argparse.Namespace, command: str, noun: str = "trials", **kwargs: Any) -> Display:
    """The trial lines and, on a terminal, the live line; under torchrun with ``--all-ranks`` the
    ranks share one terminal, so each prints its lines alone."""
    several = args.all_ranks and launched_world_size() > 1
    return Display(command, noun=noun, live=not several, **kwargs)

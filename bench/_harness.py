"""What the benchmarks share: the options they all take, a stopwatch, the machine and code they ran
on, aligned text and Markdown tables, ratios, and the results file under ``bench/results/``, which
records the commit, the device, torch and the command that wrote it."""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
#: Where a checkout is not at hand (a copy of the working tree on a GPU machine), the commit it was
#: copied from, given by whoever runs it: ``BATCHFIT_COMMIT=$(git rev-parse HEAD)``.
COMMIT_VARIABLE = "BATCHFIT_COMMIT"


def parser(doc: str | None, *, quick: str, json_default: str) -> argparse.ArgumentParser:
    """The options every benchmark takes: ``--device``, ``--quick``, ``--json``, ``--no-json``."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0] if doc else None)
    parser.add_argument(
        "--device",
        default="cpu",
        help="cpu (default), cuda[:N], or cpu-caching (CUDA's caching allocator modelled on the CPU; "
        "with expandable segments where PYTORCH_CUDA_ALLOC_CONF says so, as on CUDA)",
    )
    parser.add_argument("--quick", action="store_true", help=quick)
    parser.add_argument("--json", type=Path, default=None, help=f"results file (default {json_default})")
    parser.add_argument("--no-json", action="store_true", help="do not write the results file")
    return parser


def start(
    doc: str | None,
    argv: list[str] | None,
    *,
    quick: str,
    json_default: str,
    packages: Sequence[str] = ("torch", "batchfit"),
) -> tuple[argparse.Namespace, Session]:
    """A CPU benchmark's opening: its options (``parser``) parsed from ``argv``, its session begun
    and the machine it runs on printed."""
    args = parser(doc, quick=quick, json_default=json_default).parse_args(argv)
    session = Session(torch.device("cpu"), packages)
    print(session.machine())
    return args, session


def save(args: argparse.Namespace, session: Session, default: Path, payload: dict[str, Any]) -> None:
    """A benchmark's close: the session's time printed, then, unless ``--no-json``, the results file
    at ``--json`` or ``default``."""
    print(session.finish())
    if not args.no_json:
        write_results(args.json or default, session, payload)


class Stopwatch:
    """Wall-clock (``time.perf_counter``) and process CPU seconds of a block."""

    def __enter__(self) -> Stopwatch:
        self._wall, self._cpu = time.perf_counter(), time.process_time()
        self.seconds = self.cpu_seconds = 0.0
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self._wall
        self.cpu_seconds = time.process_time() - self._cpu


def versions(packages: Sequence[str]) -> dict[str, str | None]:
    """Each package's installed version, or None."""
    found: dict[str, str | None] = {}
    for package in packages:
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            found[package] = None
    return found


def load_average() -> str:
    """The 1, 5 and 15 minute load averages: the machine may be shared."""
    try:
        return " ".join(f"{value:.2f}" for value in os.getloadavg())
    except OSError:
        return "unknown"


#: What a run's results depend on: uncommitted changes here make its commit not the whole story.
#: The results files themselves are not code: a run that rewrites them leaves the next one's record clean.
CODE_PATHS = ("src", "bench", ":(exclude)bench/data", "examples", "pyproject.toml")


def code_version() -> dict[str, Any]:
    """The code that runs: ``git rev-parse HEAD`` and whether tracked files of ``CODE_PATHS`` differ
    from it, else ``$BATCHFIT_COMMIT``, else the package's version (``source`` says which)."""
    try:
        head = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        changed = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no", "--", *CODE_PATHS],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        return {"commit": head, "source": "git", "uncommitted_changes": bool(changed)}
    except (OSError, subprocess.CalledProcessError):
        pass
    if os.environ.get(COMMIT_VARIABLE):
        return {"commit": os.environ[COMMIT_VARIABLE], "source": COMMIT_VARIABLE, "uncommitted_changes": None}
    return {"commit": versions(["batchfit"])["batchfit"], "source": "version", "uncommitted_changes": None}


def command_line() -> str:
    """The command that runs, the script's path relative to the repository."""
    script = Path(sys.argv[0]).resolve()
    shown = script.relative_to(ROOT) if script.is_relative_to(ROOT) else script
    return shlex.join(["python", str(shown), *sys.argv[1:]])


def device_name(device: torch.device) -> str:
    """The GPU's name, or the CPU's model and the threads torch uses."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            model = next(line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{model}, {torch.get_num_threads()} threads"


class Session:
    """One run of a benchmark: what ran it, how long it took, and the load average (the machine
    may be shared) at its start and at its end."""

    def __init__(self, device: torch.device, packages: Sequence[str]) -> None:
        self.device, self.versions = device, versions(packages)
        self.code, self.command = code_version(), command_line()  # as the run starts
        self.began, self.load_at_start = time.perf_counter(), load_average()
        self.total_seconds, self.load_at_end = 0.0, "unknown"

    def machine(self) -> str:
        """Versions, the GPU or the CPU threads, and the load average at the start."""
        found = ", ".join(f"{name} {version or 'not installed'}" for name, version in self.versions.items())
        where = (
            torch.cuda.get_device_name(self.device)
            if self.device.type == "cuda"
            else f"{torch.get_num_threads()} threads"
        )
        settings = os.environ.get("PYTORCH_ALLOC_CONF") or os.environ.get("PYTORCH_CUDA_ALLOC_CONF")
        allocator = f"; allocator {settings}" if settings else ""
        return f"{found}; {where}{allocator}; load average {self.load_at_start} (1, 5, 15 min)"

    def finish(self) -> str:
        """Stop the clock; a line with the total time and the load averages."""
        self.total_seconds, self.load_at_end = time.perf_counter() - self.began, load_average()
        return (
            f"total wall time {self.total_seconds:.0f} s; load average {self.load_at_start} at start, "
            f"{self.load_at_end} at end"
        )

    def to_dict(self) -> dict[str, Any]:
        """The results file's fields about the run (after ``finish``): what code ran, where, with
        which torch, by which command, and when."""
        return {
            "code": self.code,
            "command": self.command,
            "written": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "torch": torch.__version__,
            "device": str(self.device),
            "device_name": device_name(self.device),
            "allocator_settings": os.environ.get("PYTORCH_ALLOC_CONF")
            or os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
            "versions": self.versions,
            "total_seconds": self.total_seconds,
            "load_average_at_start": self.load_at_start,
            "load_average_at_end": self.load_at_end,
        }


def ratio(value: float, base: float) -> str:
    """``value`` as a multiple of ``base`` ("2.5x"), or "-" when there is no base."""
    return f"{value / base:.1f}x" if base > 0 else "-"


def print_text_table(headers: Sequence[str], lines: list[list[str]]) -> None:
    cells = [list(headers), *lines]
    widths = [max(len(line[i]) for line in cells) for i in range(len(headers))]
    for index, line in enumerate(cells):
        print("  ".join(cell.rjust(width) for cell, width in zip(line, widths, strict=True)))
        if index == 0:
            print("  ".join("-" * width for width in widths))


def print_markdown_table(
    headers: Sequence[str], lines: list[list[str]], text_columns: Collection[int]
) -> None:
    """Columns in ``text_columns`` are left-aligned, the others (numbers) right-aligned."""
    print("| " + " | ".join(headers) + " |")
    print("|" + "|".join("---" if i in text_columns else "---:" for i in range(len(headers))) + "|")
    for line in lines:
        print("| " + " | ".join(line) + " |")


def write_results(path: Path, session: Session, payload: dict[str, Any]) -> None:
    """The results file: the session's record of the run (``Session.to_dict``), then ``payload``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**session.to_dict(), **payload}, indent=1))
    print(f"\nwrote {path}")

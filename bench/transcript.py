"""Record a command's output as a results file, for the transcripts README.md and docs/ show.

    python bench/transcript.py --json bench/data/cpu-DATE/transcript-find.json -- python -m batchfit find ...

It runs the command once, with ``src/`` on the path, and writes what it printed (stderr, then
stdout), its exit status and wall time, with the commit, the device, torch and the command
(``_harness.Session``). ``bench/tables.py`` renders it between ``<!-- table: transcript FILE -->``
markers. ``--device`` names the device the command runs on, for the record (default: the
command's own ``--device``, else cpu), so a transcript of a GPU run records the GPU;
``--cwd DIR`` runs it from ``DIR`` (relative to the repository) and ``--env NAME=VALUE`` sets a
variable for it, both recorded and shown with the command.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import _harness

from batchfit.runtime.devices.resolve import parse_device


def command_device(command: list[str]) -> str | None:
    """The device the recorded command names (``--device X`` or ``--device=X``), or None."""
    for index, word in enumerate(command):
        if word == "--device" and index + 1 < len(command):
            return command[index + 1]
        if word.startswith("--device="):
            return word.partition("=")[2]
    return None


def main(argv: list[str] | None = None) -> int:
    parser = _harness.parser(__doc__, quick="(not used)", json_default="bench/results/transcript.json")
    parser.set_defaults(device=None)
    parser.add_argument("--cwd", default=".", help="where the command runs, from the repository's root")
    parser.add_argument("--env", action="append", default=[], help="NAME=VALUE for the command (repeatable)")
    parser.add_argument("command", nargs="+", help="the command, after --")
    args = parser.parse_args(argv)
    device = parse_device(args.device or command_device(args.command) or "cpu")
    session = _harness.Session(device, ["torch", "batchfit"])
    source = str(_harness.ROOT / "src")
    path = os.environ.get("PYTHONPATH")
    settings = dict(setting.split("=", 1) for setting in args.env)
    environment = {**os.environ, **settings, "PYTHONPATH": source + (os.pathsep + path if path else "")}
    began = time.perf_counter()
    where = _harness.ROOT / args.cwd
    done = subprocess.run(args.command, capture_output=True, text=True, env=environment, cwd=where)
    seconds = time.perf_counter() - began
    print(done.stderr + done.stdout, end="")
    print(session.finish())
    if not args.no_json:
        payload = {
            "argv": args.command,
            "cwd": args.cwd,
            "env": settings,
            "returncode": done.returncode,
            "seconds": seconds,
            "stderr": done.stderr,
            "stdout": done.stdout,
        }
        _harness.write_results(args.json or _harness.RESULTS / "transcript.json", session, payload)
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())

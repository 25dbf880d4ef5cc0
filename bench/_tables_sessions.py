"""The blocks of a session's record: each run's wall time, a recorded command's transcript, the
GPU sessions' test logs and a source file shown as is."""

from __future__ import annotations

import re
from typing import Any

from _tables_base import NOTES, ROOT, markdown, provenance


def timings_table(files: list[dict[str, Any]]) -> str:
    """Each run's wall time and the load average at its start, as its results file records them."""
    lines = []
    for data in files:
        note = NOTES.get(data["path"])
        command = data.get("command", note.command if note else "?")
        device = data.get("device_name") or (note.device_name if note else data["device"])
        load = data.get("load_average_at_start", "-").split(" ")[0]
        lines.append([f"`{command}`", device, f"{data['total_seconds']:.0f}", load, f"`{data['path']}`"])
    return markdown(["command", "device", "seconds", "load average", "file"], lines, (0, 1, 4))


def transcript_block(files: list[dict[str, Any]], short: bool = False) -> str:
    """A recorded command (``bench/transcript.py``): the command, what it wrote, and where from;
    ``short``: stdout up to its first blank line, then ``...``."""
    (data,) = files
    shown = " ".join(data["argv"])
    shown = re.sub(r"^\S*python3? -m batchfit", "batchfit", shown)
    shown = re.sub(r"^\S*python3? ", "python ", shown)
    shown = " ".join([*(f"{name}={value}" for name, value in data.get("env", {}).items()), shown])
    if data.get("cwd", ".") != ".":
        shown = f"cd {data['cwd']} && {shown}"
    stdout = data["stdout"]
    if short and "\n\n" in stdout.strip("\n"):  # what follows the first blank line, left out
        stdout = stdout.strip("\n").split("\n\n")[0] + "\n...\n"
    output = (data["stderr"] + stdout).rstrip("\n")
    return f"```\n$ {shown}\n{output}\n```\n\n{provenance(data)}"


def gpu_tests_run_table(files: list[dict[str, Any]]) -> str:
    """``bench/gpu_tests_run.py``: each GPU session's pytest log, the tests its command collected at
    its commit, how many ran and their outcomes; then the gpu tests no log shows passed."""
    (data,) = files
    lines = []
    for log in data["logs"]:
        tally = ", ".join(f"{count} {outcome}" for outcome, count in log["tally"].items())
        collected = str(len(log["collected"])) if log["commit"] else "- (named by its FAILED line)"
        lines.append(
            [f"`{log['log']}`", log["commit"] or "-", collected, str(sum(log["tally"].values())), tally]
        )
    headers = ["log", "commit", "gpu tests collected", "ran", "outcomes"]
    never = "\n".join(f"- `{node}`" for node in data["never_run"])
    said = (
        f"Never passed on a GPU, {len(data['never_run'])} of the {len(data['gpu_tests_now'])} gpu tests now:"
    )
    return f"{markdown(headers, lines, (0, 1, 4))}\n\n{said}\n\n{never}\n\n{provenance(data)}"


def source_block(paths: list[str]) -> str:
    """A source file of the repository, as a Python block."""
    (path,) = paths
    return f"```python\n{(ROOT / path).read_text().rstrip()}\n```"

"""What every table of bench/tables.py uses: a results file loaded, where its figures come from
(its command, commit, device, torch and date, or the session notes' ``NOTES`` for files that do not
record them), and a Markdown table."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Note:
    """What a session's notes say of a results file that does not record it itself."""

    commit: str
    device_name: str
    command: str
    date: str


_H100 = "NVIDIA H100 80GB HBM3"
_H200 = "NVIDIA H200"
#: Results files written before the harness recorded the code, the device's name and the command,
#: with what docs/benchmarks.md's session notes said of them when they were committed (04a15a0 and
#: 6b32440). The H100's record batchfit 0.1.0, the H200's no version at all (``batchfit: null``).
NOTES: dict[str, Note] = {
    "bench/data/h100-2026-11-25/find-cuda-resnet50-amp-gpt2-resnet50.json": Note(
        "a3b253b", _H100, "bash bench/gpu_session.sh find:resnet50-amp,gpt2,resnet50", "2026-11-25"
    ),
    "bench/data/h100-2026-11-25/find-cuda-mlp-cnn-transformer.json": Note(
        "9c34277", _H100, "bash bench/gpu_session.sh find:mlp,cnn,transformer", "2026-11-25"
    ),
    "bench/data/h100-2026-11-25/find-curves-cuda-cnn-transformer.json": Note(
        "a3b253b", _H100, "bash bench/gpu_session.sh curves:cnn,transformer", "2026-11-25"
    ),
    "bench/data/h100-2026-11-25/find-curves-cuda-resnet50-amp.json": Note(
        "a3b253b", _H100, "bash bench/gpu_session.sh curves:resnet50-amp", "2026-11-25"
    ),
    "bench/data/h200-2026-11-26/find-cuda-resnet50-amp-resnet50-mlp-cnn-transformer.json": Note(
        "cccf28b",
        _H200,
        "bash bench/gpu_session.sh find:resnet50-amp,resnet50,mlp,cnn,transformer",
        "2026-11-26",
    ),
    "bench/data/h200-2026-11-26/find-cuda-expandable-cnn-transformer-mlp-resnet50-amp.json": Note(
        "cccf28b",
        _H200,
        "bash bench/gpu_session.sh expandable:cnn,transformer,mlp,resnet50-amp",
        "2026-11-26",
    ),
    "bench/data/h200-2026-11-26/compare-cuda-resnet50.json": Note(
        "cccf28b", _H200, "bash bench/gpu_session.sh compare:resnet50", "2026-11-26"
    ),
    "bench/data/h200-2026-11-26/explore-cuda-resnet50-amp.json": Note(
        "cccf28b", _H200, "bash bench/gpu_session.sh explore:resnet50-amp", "2026-11-26"
    ),
}


def load(path: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((ROOT / path).read_text())
    data["path"] = path
    return data


def provenance(data: dict[str, Any]) -> str:
    """Where a file's figures come from: its command, commit, device, torch and date."""
    path = data.get("path", "this run")
    note = NOTES.get(path)
    code = data.get("code")
    if code is not None:
        commit = f"`{code['commit'][:7] if code['source'] != 'version' else code['commit']}`"
        if code["source"] == "version":
            commit = f"batchfit {code['commit']} (no checkout)"
        elif code.get("uncommitted_changes"):
            commit += " with uncommitted changes"
        where, command, date = data["device_name"], data["command"], data["written"][:10]
    elif note is not None:
        recorded = data.get("versions", {}).get("batchfit")
        said = f"batchfit {recorded}" if recorded else "no commit (`batchfit: null`)"
        commit = f"`{note.commit}` (from the session notes; the file records {said})"
        where, command, date = note.device_name, note.command, note.date
    else:
        raise ValueError(f"{path} records no commit and NOTES has none for it")
    command = re.sub(r"\S*/python3?(?=\s)", "python", command)  # the interpreter, wherever it lives
    torch = data.get("torch") or data["versions"]["torch"]
    seconds = f", {data['total_seconds']:.0f} s" if "total_seconds" in data else ""
    load = data.get("load_average_at_start", "").split(" ")[0]
    shared = f", load average {load} at its start" if load else ""
    return (
        f"`{path}`: `{command}` at {commit} on {where} ({data['device']}), torch {torch}, {date}"
        f"{seconds}{shared}."
    )


def markdown(headers: list[str], lines: list[list[str]], text_columns: Iterable[int]) -> str:
    text = set(text_columns)
    rule = "|".join("---" if i in text else "---:" for i in range(len(headers)))
    return "\n".join(
        ["| " + " | ".join(headers) + " |", f"|{rule}|", *("| " + " | ".join(line) + " |" for line in lines)]
    )

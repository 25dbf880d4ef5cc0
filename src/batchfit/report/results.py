"""Saved results as the report reads them: the command that wrote a JSON document (the envelope's
``command``; files from before the envelope by ``legacy_kind``), and what ran (device, torch,
batchfit version, workload, time), "not recorded" where it is absent."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast, get_args

from batchfit.errors import ConfigurationError

Kind = Literal[
    "advise",
    "find",
    "explore",
    "plan",
    "analyze",
    "compare",
    "check-data",
    "noise-scale",
    "noise-prediction",
    "predict",
]
NOT_RECORDED = "not recorded"

# The keys each command's JSON held before the envelope (and bench/noise_prediction.py's results file
# holds); ``legacy_kind`` reads such a file as the first kind whose keys it has (advise first: it
# holds the other commands' results under keys of its own).
_KEYS: dict[Kind, frozenset[str]] = {
    "advise": frozenset({"train", "eval", "exploration", "comparison", "data", "plan", "changes"}),
    "find": frozenset({"workload", "results"}),
    "explore": frozenset({"points", "recommendation", "history", "unit"}),
    "plan": frozenset({"global_batch_size", "micro_batch_size", "learning_rate", "warmup_steps"}),
    "analyze": frozenset({"rows", "trials_run", "separate_trials"}),
    "compare": frozenset({"rows", "memory_fraction", "budget_bytes", "unit"}),
    "check-data": frozenset({"settings", "loader_samples_per_second", "data_wait_share"}),
    "noise-scale": frozenset({"noise_scale", "readings", "accumulation_steps", "fixed_weights"}),
    # Not a command's: the results file of bench/noise_prediction.py, which records its own command.
    "noise-prediction": frozenset({"rows", "checkpoints", "fit", "ratios"}),
    "predict": frozenset({"prediction"}),
}


@dataclass(frozen=True)
class WhatRan:
    """The facts a report states so it can be attached to an issue or a paper."""

    command: str
    workload: str
    device: str
    torch_version: str
    batchfit_version: str
    created_at: str

    def rows(self) -> list[tuple[str, str]]:
        return [
            ("command", self.command),
            ("workload", self.workload),
            ("device", self.device),
            ("torch", self.torch_version),
            ("batchfit", self.batchfit_version),
            ("time", self.created_at),
        ]


@dataclass(frozen=True)
class SavedResult:
    """One command's JSON document and the command that wrote it."""

    kind: Kind
    document: Mapping[str, Any]
    source: str  # the file it was read from, or a name given by the caller

    @property
    def what_ran(self) -> WhatRan:
        document = self.document
        device = document.get("device") or _first_device(document)
        versions = document.get("versions") or {}
        command = document.get("command")
        return WhatRan(
            command=f"batchfit {self.kind}" if command in (None, self.kind) else str(command),
            workload=_text(document.get("workload")),
            device=_text(device),
            torch_version=_text(document.get("torch_version") or versions.get("torch")),
            batchfit_version=_text(document.get("batchfit_version") or versions.get("batchfit")),
            created_at=_text(document.get("created_at") or document.get("written")),
        )


def saved_result(document: Any, source: str = "the result") -> SavedResult:
    """A JSON document as the report draws it: an envelope (what every command writes: ``command``,
    ``versions``, ``workload``, ``created_at``, ``results``) by its command; a file written before
    the envelope by ``legacy_kind``. find's section draws all its searches; the others' their one
    result, with what the envelope records beside it (explore's tolerance, advise's context)."""
    if not _is_envelope(document):
        return SavedResult(legacy_kind(document, source), document, source)
    kind = cast(Kind, document["command"])
    about = {key: value for key, value in document.items() if key != "results"}
    if kind == "find":
        return SavedResult(kind, document, source)
    (result,) = document["results"]
    if kind == "predict":  # the page draws the prediction under its own key
        return SavedResult(kind, {**about, "prediction": result}, source)
    return SavedResult(kind, {**about, **result}, source)


def recognise(document: Any, source: str = "the result") -> Kind:
    """The command that wrote ``document``: its envelope's ``command``, else ``legacy_kind``."""
    return cast(Kind, document["command"]) if _is_envelope(document) else legacy_kind(document, source)


def legacy_kind(document: Any, source: str = "the result") -> Kind:
    """The command that wrote a document from before the envelope (``{"results": [...]}`` from
    find, ``{"prediction": ...}`` from predict, the others' results with what ran merged in), told
    by the keys its command's JSON always held; and bench/noise_prediction.py's results file."""
    if isinstance(document, Mapping):
        for kind, keys in _KEYS.items():
            if keys <= document.keys():
                return kind
    found = ", ".join(sorted(document)) if isinstance(document, Mapping) else type(document).__name__
    commands = ", ".join(kind for kind in _KEYS if kind != "noise-prediction")
    raise ConfigurationError(
        f"{source} is not a saved batchfit result: its keys ({found or 'none'}) are not those of any "
        f"command's JSON output ({commands}) or of bench/noise_prediction.py's results file. Save one "
        f"with --format json --output FILE (analyze: --output FILE.json)."
    )


def _is_envelope(document: Any) -> bool:
    return (
        isinstance(document, Mapping)
        and document.get("command") in get_args(Kind)
        and isinstance(document.get("results"), list)
    )


def read_result(path: str | Path) -> SavedResult:
    """Read a saved result (what a command writes with ``--format json``; analyze: ``--output X.json``)."""
    path = Path(path)
    try:
        document = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ConfigurationError(
            f"{path} is not JSON ({error}); a report reads what a command wrote with --format json."
        ) from error
    return saved_result(document, str(path))


def _first_device(document: Mapping[str, Any]) -> Any:
    """The device a result names inside: find's first search, the first of advise's steps, or
    where predict recorded."""
    parts = [*document.get("results", ())]
    parts += [document.get(step) for step in ("train", "eval", "comparison", "data", "prediction")]
    return next((part["device"] for part in parts if isinstance(part, Mapping) and part.get("device")), None)


def _text(value: Any) -> str:
    return NOT_RECORDED if value is None or value == "" else str(value)

"""The one protocol every verb's result follows (``Result``), and the versions each result's
dictionary carries. Torch-free and a leaf, so that the policies' results (``Plan``) follow it too."""

from __future__ import annotations

import importlib.metadata
import json
import platform
import sys
from typing import Any, ClassVar, Protocol, runtime_checkable


@runtime_checkable
class Result(Protocol):
    """What a verb returns: its data as a dictionary (carrying ``command``, the verb that made it,
    and ``versions``) and as JSON, one paragraph (``summary``) and the full text (``table``)."""

    command: ClassVar[str]  # the verb as the command line names it: "find", "check-data", ...

    def to_dict(self) -> dict[str, Any]: ...

    def to_json(self) -> str: ...

    def summary(self) -> str: ...

    def table(self) -> str: ...


def versions() -> dict[str, str | None]:
    """The versions a result was made with: batchfit, torch (None where it is not installed) and
    Python. Read without importing torch, so that a torch-free policy can record them."""
    batchfit = sys.modules.get("batchfit")
    torch = sys.modules.get("torch")
    return {
        "batchfit": getattr(batchfit, "__version__", None) or _installed("batchfit"),
        "torch": getattr(torch, "__version__", None) or _installed("torch"),
        "python": platform.python_version(),
    }


def stamped(command: str, data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with the ``command`` that made it and the ``versions`` first, as ``to_dict`` gives
    it: in JSON's own types (lists, string keys), so that it equals what a reader of the JSON gets."""
    return dict(json.loads(json.dumps({"command": command, "versions": versions(), **data})))


def to_json(result: Result) -> str:
    """``result.to_dict()`` as indented JSON, one trailing newline."""
    return json.dumps(result.to_dict(), indent=2) + "\n"


def _installed(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None

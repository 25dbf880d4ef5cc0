"""An audit, not a test: torch says a CUDA device is present on a CPU-only machine, so a test that
reaches for ``cuda`` by default (where it means the CPU) fails at its first CUDA call.

    PYTHONPATH=bench/audit .venv/bin/python -m pytest -m "not gpu and not slow" -o addopts=""

Python imports ``sitecustomize`` at start-up, in the test process and in every subprocess a test
starts; the patch waits for torch to be imported, then replaces two of ``torch.cuda``'s functions.
Tests marked ``gpu`` are left out: they would run, and fail for want of a GPU.
"""

from __future__ import annotations

import builtins
import sys
from typing import Any

_real_import = builtins.__import__
_patched = False


def _patch() -> None:
    torch: Any = sys.modules["torch"]
    torch.cuda.is_available = lambda: True
    torch.cuda.device_count = lambda: 1


def _import(name: str, *args: Any, **kwargs: Any) -> Any:
    global _patched
    module = _real_import(name, *args, **kwargs)
    torch = sys.modules.get("torch")
    if not _patched and torch is not None and hasattr(torch, "cuda") and hasattr(torch, "Tensor"):
        _patched = True
        _patch()
    return module


builtins.__import__ = _import

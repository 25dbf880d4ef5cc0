"""Saved results for the report tests, from real runs of the built-in mlp example on the CPU (find on
a device capped at 48 MiB, so each search hits a real oom), written as the CLI's --format json writes
them and read back from JSON. Session-scoped: each command runs once for all the report tests."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch

import batchfit
from batchfit import find_batch_size
from batchfit.explore import explore
from batchfit.policy.plan import plan
from batchfit.report import SavedResult
from batchfit.runtime.examples import build_example

CREATED_AT = "2025-01-01T00:00:00+00:00"
WHAT_RAN = {
    "batchfit_version": batchfit.__version__,
    "torch_version": torch.__version__,
    "created_at": CREATED_AT,
}


def as_saved(document: dict[str, Any]) -> dict[str, Any]:
    """``document`` as read back from its file."""
    return dict(json.loads(json.dumps(document)))


@pytest.fixture(scope="session")
def find_document() -> dict[str, Any]:
    """What ``batchfit find --format json`` writes, for train and eval; each hits a real oom."""
    results = [
        find_batch_size(
            build_example("mlp", "cpu"), mode, device="cpu", memory_limit="48MiB", max_batch_size=1024
        )
        for mode in ("train", "eval")
    ]
    return as_saved({"workload": "mlp", **WHAT_RAN, "results": [result.to_dict() for result in results]})


@pytest.fixture(scope="session")
def find_result(find_document: dict[str, Any]) -> SavedResult:
    return SavedResult("find", find_document, "find.json")


@pytest.fixture(scope="session")
def explore_result() -> SavedResult:
    """What ``batchfit explore --format json`` writes for a one-second exploration."""
    result = explore(build_example("mlp", "cpu"), device="cpu", max_batch_size=64, time_budget_seconds=1)
    document = {**result.to_dict(), "workload": "mlp", "device": "cpu", "tolerance": 0.03, **WHAT_RAN}
    return SavedResult("explore", as_saved(document), "explore.json")


@pytest.fixture(scope="session")
def plan_result() -> SavedResult:
    """What ``batchfit plan --format json`` writes for 1024 samples over 8 ranks."""
    result = plan(1024, world_size=8, max_micro_batch_size=48, base_learning_rate=0.1, base_batch_size=256)
    document = {**result.to_dict(), "batchfit_version": batchfit.__version__, "created_at": CREATED_AT}
    return SavedResult("plan", as_saved(document), "plan.json")

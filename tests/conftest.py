"""The suite's hooks (gpu tests skipped without CUDA, a deadline for a run under a time budget, the
tests a file names run first) and the fixtures of the shared workloads."""

from __future__ import annotations

import os
import time

import pytest
import torch
from tiny_workloads import build

from batchfit import Workload

#: A file of node ids (one a line; ``#`` starts a comment line) whose tests run first, in its order,
#: the rest after them in theirs: the smoke's gpu tests that have never run on a GPU
#: (``bench/gpu_never_run.txt``), so a run cut short by its deadline skips tests that have.
FIRST = "BATCHFIT_TEST_FIRST"


def first_listed(path: str) -> list[str]:
    """The node ids a ``BATCHFIT_TEST_FIRST`` file lists."""
    with open(path) as listed:
        return [line.strip() for line in listed if line.strip() and not line.lstrip().startswith("#")]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The tests ``BATCHFIT_TEST_FIRST`` lists go first; tests marked ``gpu`` are skipped, with the
    reason, where torch sees no CUDA device."""
    if path := os.environ.get(FIRST):
        rank = {node: index for index, node in enumerate(first_listed(path))}
        # A stable sort: the tests not listed keep their order, after the listed ones.
        items.sort(key=lambda item: rank.get(item.nodeid, len(rank)))
    if torch.cuda.is_available():
        return
    reason = (
        f"needs a CUDA device; torch {torch.__version__} sees none (torch.version.cuda={torch.version.cuda})"
    )
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(pytest.mark.skip(reason=reason))


#: Seconds from the start of the run after which a test that has not begun is skipped: a run under a
#: budget (the GPU smoke's) then ends on its own, with its summary and durations, not killed.
DEADLINE = "BATCHFIT_TEST_DEADLINE"
_BEGAN = time.monotonic()


def pytest_configure(config: pytest.Config) -> None:
    value = os.environ.get(DEADLINE)
    if value is not None and not (value.replace(".", "", 1).isdigit() and float(value) > 0):
        raise pytest.UsageError(f"{DEADLINE}={value!r}: give the run's seconds, a positive number")
    first = os.environ.get(FIRST)
    if first and not os.path.isfile(first):
        raise pytest.UsageError(f"{FIRST}={first!r}: no such file; give a file of node ids, one a line")


def pytest_runtest_setup(item: pytest.Item) -> None:
    value = os.environ.get(DEADLINE)
    if value is not None and time.monotonic() - _BEGAN > float(value):
        pytest.skip(f"{DEADLINE}={value}: the run's {value} s were spent before this test began")


@pytest.fixture
def mlp_workload() -> Workload:
    return build("mlp")


@pytest.fixture
def cnn_workload() -> Workload:
    return build("cnn", "sgd")

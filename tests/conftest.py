"""The suite's hooks (gpu tests skipped without CUDA) and the fixtures of the shared workloads."""

from __future__ import annotations

import pytest
import torch
from tiny_workloads import build

from batchfit import Workload


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``gpu`` are skipped, with the reason, where torch sees no CUDA device."""
    if torch.cuda.is_available():
        return
    reason = (
        f"needs a CUDA device; torch {torch.__version__} sees none (torch.version.cuda={torch.version.cuda})"
    )
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture
def mlp_workload() -> Workload:
    return build("mlp")


@pytest.fixture
def cnn_workload() -> Workload:
    return build("cnn", "sgd")

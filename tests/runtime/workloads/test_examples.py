"""The built-in workloads train and evaluate, and building one leaves the caller's RNG alone."""

from __future__ import annotations

import pytest
import torch

from batchfit.errors import ConfigurationError
from batchfit.runtime.workloads.examples import EXAMPLES, build_example


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_example_trains_and_evaluates(name: str) -> None:
    state = torch.get_rng_state()
    workload = build_example(name, "cpu")
    assert torch.equal(state, torch.get_rng_state())
    optimizer = workload.build_optimizer()
    batch = workload.host_batch(3)
    before = [p.detach().clone() for p in workload.model.parameters()]
    workload.run_train_step(optimizer, batch)
    assert any(not torch.equal(a, b) for a, b in zip(before, workload.model.parameters(), strict=True))
    workload.model.eval()
    workload.run_eval_step(batch)


def test_examples_are_deterministic() -> None:
    first, second = build_example("transformer", "cpu"), build_example("transformer", "cpu")
    for a, b in zip(first.model.parameters(), second.model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_unknown_example() -> None:
    with pytest.raises(
        ConfigurationError, match=r"unknown example 'resnet': choose one of cnn, mlp, transformer."
    ):
        build_example("resnet")

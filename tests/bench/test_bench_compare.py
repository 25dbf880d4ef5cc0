"""The truth of compare's benchmark (bench/compare.py): a technique's largest batch by force, on the
model compare searched."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

# bench/ is a directory of scripts, not a package: its directory goes on the path.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import compare as compare_bench
from _capped import FreshState
from _workloads import build


def test_each_probe_trains_the_searched_model_from_its_built_weights() -> None:
    # One model in one place for every probe (a model built anew per probe sits elsewhere in an
    # expandable segment), its weights put back and its optimizer's state dropped first: the same
    # batch trains the same after other probes trained it.
    workload = build("mlp", torch.device("cpu"))
    state = FreshState(workload)
    weights = state.weights
    places = [parameter.data_ptr() for parameter in workload.model.parameters()]

    def probe(batch: int, budget: int) -> bool:
        torch.manual_seed(0)  # the same dropout in each probe
        return compare_bench.fits(workload, state, (), None, budget, batch)

    budget = 48 * 2**20
    assert probe(8, budget)
    assert isinstance(workload.optimizer, torch.optim.Optimizer)
    assert not workload.optimizer.state  # Adam's state, made by the probe, is not left resident
    trained = {key: value.clone() for key, value in workload.model.state_dict().items()}
    assert any(not torch.equal(trained[key], weights[key]) for key in weights)  # the probe trained it
    assert not probe(100_000, budget)
    assert probe(8, budget)  # from the built weights again
    assert [parameter.data_ptr() for parameter in workload.model.parameters()] == places
    after_one = {key: value.clone() for key, value in workload.model.state_dict().items()}
    assert all(torch.equal(after_one[key], trained[key]) for key in weights)  # the same 10 steps

"""The truth of compare's benchmark (bench/compare.py): a technique's largest batch by force, on the
model compare searched."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from tiny_workloads import build as build_tiny

import batchfit

# bench/ is a directory of scripts, not a package: its directory goes on the path.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import compare as compare_bench
from _capped import FreshState
from _truth import TRUTH_STEPS, window
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
        return compare_bench.fits(workload, state, (), None, budget, batch, TRUTH_STEPS)

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


def test_each_row_is_judged_on_a_scan_around_its_answer() -> None:
    # The tests' MLP, its baseline and bfloat16 autocast under 1.89 MB: every row's curve covers 12%
    # around its answer, the baseline's agrees with brute force, and each answer is exact (and
    # trains 20 steps).
    workload = build_tiny("mlp")
    state = FreshState(workload)
    comparison = batchfit.compare(
        workload,
        ["amp"],
        device="cpu",
        memory_limit=1_890_000,
        memory_fraction=1.0,
        timing=batchfit.Timing(time_budget_seconds=0, windows=1, time_slow=True),
    )
    curves = compare_bench.check(workload, state, comparison, None)
    judged = [(row, curve) for row, curve in zip(comparison.rows, curves, strict=True) if curve is not None]
    assert [row.technique for row, _ in judged] == ["baseline", "amp"]
    for row, curve in judged:
        assert row.batch_size is not None
        low, high = window(row.batch_size)
        assert set(range(low, high + 1)) <= set(curve.fits)
        assert comparison.budget_bytes is not None
        if row.technique == "baseline":
            budget = comparison.budget_bytes
            brute = {
                size: compare_bench.fits(workload, state, (), None, budget, size, TRUTH_STEPS)
                for size in sorted(curve.fits)
            }
            assert brute == curve.fits
        line = compare_bench.verdict_line(row.technique, row.batch_size, curve, None, row.batch_ratio)
        assert line[2] == "exact", (row.technique, row.batch_size, curve.describe())
    case = compare_bench.case_dict("mlp", "1.89MB", comparison, curves)
    assert [verdict["exact"] for verdict in case["verdicts"] if verdict] == [True, True]

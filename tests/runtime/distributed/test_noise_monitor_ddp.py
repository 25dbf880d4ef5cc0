"""MicroBatchStep's noise-scale monitor under real DDP on 2 gloo ranks: each rank reads its own
micro-batches against its own accumulated batch and the ranks' readings are averaged, so both
report the same estimate, that of the readings computed apart in one process; the schedule grows
both ranks' batches together (marker ``distributed``)."""

from __future__ import annotations

import json
from pathlib import Path

import noise_monitor_workers as workers
import pytest
import torch
from micro_batch_helpers import make_model
from torch import nn
from two_ranks import run_ranks

from batchfit.policy.noise.noise_scale import GradientReading, estimate

pytestmark = pytest.mark.distributed


def brute_force_reading(weights: dict[str, torch.Tensor], samples: int) -> GradientReading:
    """One step's reading computed apart: on each rank's batch, each micro-batch's gradient of its
    mean loss; each rank's squared norms (micro-batches against their mean), averaged over the ranks."""
    model = make_model()
    model.load_state_dict(weights)
    small, big = [], []
    for rank in range(2):
        inputs, targets = workers.rank_batch(rank, samples)
        grads = []
        for start in range(0, samples, workers.MICRO_BATCH_SIZE):
            end = start + workers.MICRO_BATCH_SIZE
            loss = nn.functional.cross_entropy(model(inputs[start:end]), targets[start:end])
            grads.append(
                torch.cat([grad.flatten() for grad in torch.autograd.grad(loss, list(model.parameters()))])
            )
        small.append(sum(float(grad.square().sum()) for grad in grads) / len(grads))
        big.append(float(torch.stack(grads).mean(dim=0).square().sum()))
    return GradientReading(workers.MICRO_BATCH_SIZE, samples, sum(small) / 2, sum(big) / 2)


def test_both_ranks_report_the_estimate_of_the_readings_computed_apart_and_grow_together(
    tmp_path: Path,
) -> None:
    run_ranks(workers.main, (str(tmp_path / "store"), str(tmp_path)), "the noise monitor under DDP")
    ranks = [json.loads((tmp_path / f"{rank}.json").read_text()) for rank in range(2)]
    assert all("error" not in rank for rank in ranks), ranks
    assert ranks[0]["readings"] == ranks[1]["readings"] and ranks[0]["reports"] == ranks[1]["reports"]
    weights = [torch.load(tmp_path / f"weights{rank}.pt") for rank in range(2)]
    for first, second in zip(*weights, strict=True):
        assert all(torch.equal(first[name], second[name]) for name in first)

    # Both ranks grow at the first report, 3 steps in: 4 micro-batches of 16 per rank -> 8.
    for rank in ranks:
        assert rank["batch_sizes"] == [64, 64, 64, 128, 128, 128]
        assert rank["learning_rates"] == [pytest.approx(2 * workers.LEARNING_RATE)]  # SGD: linear
    first, second = ranks[0]["reports"]
    assert first["change"] is not None and first["change"]["new_accumulation_steps"] == 8
    assert first["change"]["old_global_batch_size"] == 128 and first["change"]["new_global_batch_size"] == 256
    assert second["change"] is None  # 8 is the most accumulation the schedule allows

    truth = [brute_force_reading(weights[0][step], size) for step, size in enumerate(ranks[0]["batch_sizes"])]
    for recorded, expected in zip(ranks[0]["readings"], truth, strict=True):
        assert recorded[:2] == [expected.small_batch_size, expected.big_batch_size]
        torch.testing.assert_close(
            recorded[2:], [expected.small_norm_sq, expected.big_norm_sq], rtol=1e-9, atol=0
        )
    for report, window in zip((first, second), (truth[:3], truth[3:]), strict=True):
        offline = estimate(window)
        assert offline.resolved and offline.low is not None and offline.low > 0
        assert report["noise_scale"]["b_simple"] == pytest.approx(offline.b_simple, rel=1e-9)
        assert report["noise_scale"]["low"] == pytest.approx(offline.low, rel=1e-9)
        assert report["noise_scale"]["high"] == pytest.approx(offline.high, rel=1e-9)

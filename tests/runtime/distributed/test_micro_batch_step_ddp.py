"""MicroBatchStep under real DDP on 2 gloo ranks: an out-of-memory on one rank in backward switches both
ranks to the same smaller micro-batch without a hang, and the weights equal one process's full-batch
steps; an error or a non-finite loss on one rank stops (or skips) both (marker ``distributed``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import micro_batch_step_workers as workers
import pytest
import torch
from micro_batch_helpers import adam, backward_oom_cap, full_batch_step, make_model
from two_ranks import run_ranks

from batchfit.runtime.steps.finite import WHAT_TO_CHECK

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict[str, Any]], Path]:
    """Both scenarios on the same two ranks (one spawn: starting the ranks is most of the time)."""
    out = tmp_path_factory.mktemp("ranks")
    cap = backward_oom_cap(workers.rank_batch(0, 1), fails=64, fits=32)
    run_ranks(workers.main, (str(out / "store"), cap, str(out)), "MicroBatchStep")
    return [json.loads((out / f"{rank}.json").read_text()) for rank in range(2)], out


def test_an_out_of_memory_on_one_rank_switches_every_rank(reports: tuple[list[dict[str, Any]], Path]) -> None:
    """Rank 1 runs out of memory in backward at 64; both ranks retry at 32, average their gradients once
    per step outside DDP's hooks, and end with the weights of one process stepping on both ranks'
    samples together (400 per step, the mean of the two ranks' means)."""
    ranks, out = reports
    results = [rank["out_of_memory"] for rank in ranks]
    assert all("unexpected" not in result for result in results), results
    change = {
        "optimizer_step": 0,
        "old_micro_batch_size": 64,
        "new_micro_batch_size": 32,
        "reason": "out of memory in backward on rank 1",
    }
    for result in results:
        assert result["micro_batch_size"] == 32 and result["history"] == [change]
        assert result["ddp_allreduces"] == 0  # every micro-batch ran in no_sync()
        assert result["optimizer_steps"] == [2.0] * 4 and result["gradients_left"] == 0
        assert result["seconds"] < 20

    reference = make_model()
    optimizer = adam(reference)
    for step in range(2):
        shares = [workers.rank_batch(step, rank) for rank in range(2)]
        full_batch_step(
            reference, optimizer, (torch.cat([s[0] for s in shares]), torch.cat([s[1] for s in shares]))
        )
    initial = make_model().state_dict()
    weights = [torch.load(out / f"weights{rank}.pt") for rank in range(2)]
    for name, value in reference.state_dict().items():
        assert torch.equal(weights[0][name], weights[1][name]), f"{name} differs between the ranks"
        torch.testing.assert_close(weights[0][name], value, atol=1e-13, rtol=1e-11, msg=name)
        assert not torch.allclose(value, initial[name]), f"{name} did not move"


def test_an_error_on_one_rank_stops_every_rank(reports: tuple[list[dict[str, Any]], Path]) -> None:
    """Rank 1's loss raises a ValueError in its second micro-batch: rank 1 raises it, rank 0 raises
    RankFailedError naming it, both at once and without gradients left."""
    ranks, _ = reports
    results = [rank["error"] for rank in ranks]
    assert results[1]["error"] == "ValueError" and results[1]["message"] == "a bug in rank 1's loss"
    assert any("on rank 1 of 2" in note for note in results[1]["notes"])
    assert results[0]["error"] == "RankFailedError"
    assert results[0]["message"].startswith(
        "rank 1 of 2 raised ValueError: a bug in rank 1's loss; every rank"
    )
    assert [result["calls"] for result in results] == [2, 2]  # rank 0 stopped after the same micro-batch
    assert all(result["gradients_left"] == 0 and result["seconds"] < 20 for result in results), results


def test_a_non_finite_loss_on_one_rank_stops_or_skips_every_rank(
    reports: tuple[list[dict[str, Any]], Path],
) -> None:
    """Rank 1's micro-batch 2 holds a NaN: both ranks raise NonFiniteError naming it (the averaged
    gradients are NaN on both); skipping, both skip it and step together on the next batch."""
    ranks, _ = reports
    results = [rank["non_finite"] for rank in ranks]
    assert all("unexpected" not in result for result in results), results
    rest = (
        "; the optimizer did not step and the batch's gradients were dropped. Pass non_finite='skip' to "
        "skip such a step as a GradScaler does. "
    )
    for result in results:
        assert result["raised"] == (
            "NonFiniteError: MicroBatchStep, optimizer step 0 (micro_batch_size 64): on rank 0, the "
            "gradients of 'module.0.weight', "
            "'module.0.bias', 'module.2.weight' and 1 more are not finite (NaN or inf) after the step's 4 "
            "micro-batches, whose losses are finite; on rank 1, the loss of micro-batch 2 of 4 (samples 64 "
            "to 127 of 200) is nan" + rest + WHAT_TO_CHECK
        )
        assert result["skipped"] == [1, 0] and result["after"] == [1, 1]
    assert results[0]["weights"] == results[1]["weights"]


def test_gradients_are_averaged_in_bounded_buckets_as_ddp_averages(
    reports: tuple[list[dict[str, Any]], Path],
) -> None:
    """Each gradient becomes the mean of the ranks' (zeros where a rank has none, as DDP's reduction of
    an unused parameter); one no rank holds stays None; the buffers hold at most 64 bytes per dtype."""
    ranks, _ = reports
    results = [rank["average"] for rank in ranks]
    sizes = [3, 5, 40, 4, 2, 3]
    expected: list[list[float] | None] = []
    for index, size in enumerate(sizes):
        per_rank = [[float(i * (rank + 1) + index) for i in range(size)] for rank in range(2)]
        if index == 3:
            per_rank[1] = [0.0] * size
        expected.append(None if index == 4 else [(a + b) / 2 for a, b in zip(*per_rank, strict=True)])
    for result in results:
        assert result["gradients"] == expected
        assert result["buffer_bytes"] == 8 * 8 + 3 * 4

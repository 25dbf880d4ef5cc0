"""noise_scale on 2 real gloo ranks: each rank's half against the all-reduced whole, read through
a DDP communication hook, equals one process reading the same batches as two micro-batches
(marker ``distributed``)."""

from __future__ import annotations

import json
from pathlib import Path

import noise_scale_workers as workers
import pytest
import torch
from two_ranks import run_ranks

import batchfit

pytestmark = pytest.mark.distributed


def test_ranks_against_their_all_reduce_equal_one_process_s_micro_batches(tmp_path: Path) -> None:
    """Same model, same seed, so the same global batches: the 2 ranks' readings (32 against 64) are
    the single process's (micro-batches of 32 accumulated to 64) over 4 training steps, and both
    ranks hold the same estimate and their weights back."""
    run_ranks(workers.main, (str(tmp_path / "store"), str(tmp_path)), "noise_scale under DDP")
    ranks = [json.loads((tmp_path / f"{rank}.json").read_text()) for rank in range(2)]
    assert all("error" not in rank for rank in ranks), ranks
    alone = workers.read(batchfit.Sampling(workers.BATCH_SIZE, micro_batch_size=32, steps=workers.STEPS))
    assert alone["world_size"] == 1 and [rank["world_size"] for rank in ranks] == [2, 2]
    assert ranks[0]["readings"] == ranks[1]["readings"] and ranks[0]["b_simple"] == ranks[1]["b_simple"]
    assert all(rank["restored"] for rank in ranks) and alone["restored"]
    for together, single in zip(ranks[0]["readings"], alone["readings"], strict=True):
        assert together[:2] == single[:2] == [32, 64]
        torch.testing.assert_close(together[2:], single[2:], rtol=1e-10, atol=0)
    assert ranks[0]["b_simple"] == pytest.approx(alone["b_simple"], rel=1e-9)

"""The ranks of the noise-scale DDP test: each a real process in a gloo group (spawned by
test_noise_scale_ddp.py), reading the same workload's noise scale together."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from micro_batch_helpers import make_model
from torch import nn
from two_ranks import report_and_leave

import batchfit

BATCH_SIZE, STEPS = 64, 4


def workload() -> batchfit.Workload:
    """The float64 MLP with Adam, on batches drawn from torch's RNG (which the verb seeds per step)."""
    model = make_model()

    def make_batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(n, 16, dtype=torch.float64), torch.randint(0, 4, (n,))

    return batchfit.Workload(
        model=model,
        optimizer=torch.optim.Adam(model.parameters(), lr=1e-2),
        make_batch=make_batch,
        loss_fn=nn.functional.cross_entropy,
    )


def read(sampling: batchfit.Sampling) -> dict[str, Any]:
    """The result's readings and estimate, and whether the weights came back."""
    job = workload()
    before = {name: value.clone() for name, value in job.model.state_dict().items()}
    torch.manual_seed(0)  # the seed the ranks' batches are drawn from is rank 0's
    result = batchfit.noise_scale(job, sampling=sampling, device="cpu")
    return {
        "readings": [
            [r.small_batch_size, r.big_batch_size, r.small_norm_sq, r.big_norm_sq] for r in result.readings
        ],
        "b_simple": result.b_simple,
        "world_size": result.world_size,
        "restored": all(torch.equal(value, before[name]) for name, value in job.model.state_dict().items()),
    }


def main(rank: int, world_size: int, store: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{store}", rank=rank, world_size=world_size, timeout=timedelta(seconds=60)
    )
    report_and_leave(out, rank, lambda: read(batchfit.Sampling(BATCH_SIZE, steps=STEPS)))

"""The ranks of the Lightning distributed tests: each a real process that joins a 2-rank gloo
group through Lightning's own strategy (spawned by test_lightning.py, launched as torchrun would:
the environment names its rank), searches with the callback on a capped CPU of its own, and
trains: in DDP, or sharded by FSDP2's ``fully_shard`` under ModelParallelStrategy."""

from __future__ import annotations

import os
from typing import Any

import torch
from lightning.pytorch.strategies import ModelParallelStrategy, Strategy
from lightning_tiny import Capped, Classifier, trainer
from two_ranks import report_and_leave

from batchfit import BatchSizes
from batchfit.integrations.lightning import BatchfitCallback
from batchfit.units import parse_bytes

#: Optimizer steps each rank trains after the search, under its own cap.
STEPS = 5
#: Each rank's loader batch, as the module is configured: a global batch of 2 x 512 to keep.
BATCH_SIZE = 512
#: FSDP2's ``fully_shard`` runs on the CPU from torch 2.7.
FULLY_SHARD = tuple(int(part) for part in torch.__version__.split(".")[:2]) >= (2, 7)


class ShardedClassifier(Classifier):
    """The Classifier with each layer and the whole sharded by ``fully_shard`` over the ranks."""

    def configure_model(self) -> None:
        from torch.distributed.fsdp import fully_shard

        mesh = self.device_mesh["data_parallel"]
        for layer in (self.net[0], self.net[2], self.net):
            fully_shard(layer, mesh=mesh)


def main(rank: int, world_size: int, port: int, limits: list[str], out: str, sharded: bool) -> None:
    torch.set_num_threads(1)  # as torchrun sets OMP_NUM_THREADS=1 for several ranks on a machine
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), NODE_RANK="0", LOCAL_RANK=str(rank))
    report_and_leave(out, rank, lambda: _fit(limits[rank], world_size, sharded))


def _fit(limit: str, world_size: int, sharded: bool) -> dict[str, Any]:
    callback = BatchfitCallback(memory_limit=limit, sizes=BatchSizes(max_batch_size=1024))
    capped = Capped(int(0.8 * parse_bytes(limit)))
    strategy: str | Strategy = "ddp"
    model = Classifier(batch_size=BATCH_SIZE, optimizers="tuple")
    if sharded:
        strategy = ModelParallelStrategy(data_parallel_size=world_size, tensor_parallel_size=1)
        model = ShardedClassifier(batch_size=BATCH_SIZE, optimizers="tuple")
    run = trainer([callback, capped], strategy=strategy, devices=world_size, max_steps=STEPS)
    run.fit(model)
    found = callback.results["train"]
    assert callback.plan is not None
    return {
        "plan": callback.plan.to_dict(),
        "batch_size": found.batch_size,
        "world_size": found.world_size,
        "trials": [trial.batch_size for trial in found.trials],
        "outcomes": [trial.outcome for trial in found.trials],
        "details": [trial.detail for trial in found.trials],
        "steps": capped.steps,
        "accumulate_grad_batches": run.accumulate_grad_batches,
        "loader_batch_size": run.train_dataloader.batch_size,  # type: ignore[union-attr]
    }

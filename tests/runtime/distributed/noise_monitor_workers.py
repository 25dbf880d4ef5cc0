"""The ranks of the MicroBatchStep noise-monitor DDP test: each a real process in a real gloo group
(spawned by test_noise_monitor_ddp.py), training the same tiny DDP model on its own fixed batch with
the monitor and its schedule, recording every reading, report and change."""

from __future__ import annotations

from dataclasses import astuple
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from micro_batch_helpers import make_model
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from two_ranks import report_and_leave

from batchfit import MicroBatchOptions, MicroBatchStep
from batchfit.policy.noise.noise_scale import GradientReading
from batchfit.policy.plan.batch_schedule import BatchSchedule
from batchfit.policy.plan.noise_monitor import NoiseScaleMonitor

MICRO_BATCH_SIZE = 16
FIRST_BATCH_SIZE = 64  # per rank: 4 micro-batches
STEPS = 6
LEARNING_RATE = 1e-3
#: Grows the accumulation at the first report (3 steps in): the same batches every step at a small
#: rate give readings that barely move, so the interval is narrow and above 0.001 x the grown batch.
SCHEDULE = BatchSchedule(max_accumulation_steps=8, min_steps=3, margin=1e-3)


def rank_batch(rank: int, samples: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s batch of ``samples`` (the first ``samples`` of a fixed 128): labels a fixed
    function of the inputs, so the mean gradient is well above the noise of a micro-batch."""
    generator = torch.Generator().manual_seed(rank)
    inputs = torch.randn(128, 16, generator=generator, dtype=torch.float64)
    return inputs[:samples], inputs[:samples, :4].argmax(dim=1)


class RecordingMonitor(NoiseScaleMonitor):
    """The monitor, keeping every reading it is given."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.recorded: list[GradientReading] = []

    def record(self, reading: GradientReading, **kwargs: Any) -> Any:
        self.recorded.append(reading)
        return super().record(reading, **kwargs)


def train(rank: int, out: Path) -> dict[str, Any]:
    """``STEPS`` optimizer steps at the batch the step asks for; each step's starting weights saved."""
    model = DistributedDataParallel(make_model())
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
    monitor = RecordingMonitor(every=3, schedule=SCHEDULE)
    step = MicroBatchStep(
        model,
        optimizer,
        loss_fn=nn.functional.cross_entropy,
        micro_batch_size=MICRO_BATCH_SIZE,
        options=MicroBatchOptions(noise_monitor=monitor),
    )
    weights, batch_sizes, reports = [], [], []
    for _ in range(STEPS):
        weights.append({name: value.clone() for name, value in model.module.state_dict().items()})
        samples = step.batch_size or FIRST_BATCH_SIZE
        batch_sizes.append(samples)
        step(rank_batch(rank, samples))
        latest = monitor.latest
        if latest is not None and (not reports or reports[-1]["optimizer_step"] != latest.optimizer_step):
            reports.append(latest.to_dict())
    torch.save(weights, out / f"weights{rank}.pt")
    return {
        "readings": [list(astuple(reading)) for reading in monitor.recorded],
        "reports": reports,
        "batch_sizes": batch_sizes,
        "learning_rates": [group["lr"] for group in optimizer.param_groups],
    }


def main(rank: int, world_size: int, store: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{store}", rank=rank, world_size=world_size, timeout=timedelta(seconds=60)
    )
    report_and_leave(out, rank, lambda: train(rank, Path(out)))

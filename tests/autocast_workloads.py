"""A real workload whose step sleeps under autocast: a technique several times slower a step than
the baseline, deterministically, on any CPU."""

from __future__ import annotations

import time

import torch
from tiny_workloads import classification_batch
from torch import nn

from batchfit import Workload


class SleepsUnderAutocast(nn.Module):
    """A small MLP that sleeps ``sleep_seconds`` in each forward run under CPU autocast, and
    records each forward's batch size and whether autocast was on."""

    def __init__(self, sleep_seconds: float) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
        self.sleep_seconds = sleep_seconds
        self.calls: list[tuple[int, bool]] = []

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        autocast = torch.is_autocast_enabled("cpu")
        self.calls.append((inputs.shape[0], autocast))
        if autocast:
            time.sleep(self.sleep_seconds)
        return self.layers(inputs)


def sleepy(sleep_seconds: float) -> tuple[Workload, SleepsUnderAutocast]:
    torch.manual_seed(0)
    model = SleepsUnderAutocast(sleep_seconds)
    workload = Workload(
        model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        make_batch=classification_batch((64,)),
        loss_fn=nn.functional.cross_entropy,
        name="sleepy-mlp",
    )
    return workload, model

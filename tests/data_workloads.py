"""Workloads with real datasets for ``check_data`` (tests/data_check/test_check_data.py) and for
``batchfit check-data --workload data_workloads:FUNCTION`` (tests/cli/test_cli_check_data.py, run
from tests/). Importable on its own: torch and batchfit only, datasets at the top level.

The slow datasets are slow on purpose: a sleep per item (storage or a remote read) or real
arithmetic per item (a CPU-heavy transform). Their steps train a tiny model for real and then
sleep ``STEP_SECONDS``: the host waiting for an accelerator, as it does on a GPU, so that a
loader with enough workers can keep up on a 2-core machine and the figures do not depend on
what else is running.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, IterableDataset

import batchfit

#: Each item of SleepyItems sleeps this long: 32 items, about 70 ms a batch.
ITEM_SLEEP_SECONDS = 0.002
#: The device's share of a step, slept on the host after the real training step.
STEP_SECONDS = 0.05
#: Matrix products per item of HeavyItems: about 1 ms of one core per item.
HEAVY_PRODUCTS = 48


class SleepyItems(Dataset[tuple[torch.Tensor, int]]):
    def __init__(self, length: int = 1024) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        time.sleep(ITEM_SLEEP_SECONDS)
        return torch.full((32,), float(index % 7)), index % 4


class HeavyItems(Dataset[tuple[torch.Tensor, int]]):
    """A deterministic CPU-heavy transform: repeated 64x64 products from a seeded start."""

    def __len__(self) -> int:
        return 1024

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        values = torch.randn(64, 64, generator=torch.Generator().manual_seed(index))
        for _ in range(HEAVY_PRODUCTS):
            values = torch.tanh(values @ values * 0.125)
        return values[0, :32].clone(), index % 4


class InMemoryItems(Dataset[tuple[torch.Tensor, int]]):
    """Tensors already in memory: an item is an index."""

    def __init__(self, length: int = 4096) -> None:
        self.inputs = torch.randn(length, 32, generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.inputs)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self.inputs[index], index % 4


class Stream(IterableDataset[tuple[torch.Tensor, int]]):
    def __iter__(self) -> Any:
        return iter([(torch.zeros(32), 0)] * 64)


def tiny_model() -> nn.Module:
    """32-64-4 with dropout: its steps draw from torch's RNG, which check_data must put back."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 4))


def device_step(seconds: float) -> Callable[[nn.Module, Any, Any], None]:
    """A real training step, then ``seconds`` of waiting: the accelerator's share of the step."""

    def train_step(model: nn.Module, optimizer: Any, batch: Any) -> None:
        inputs, target = batch
        optimizer.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(inputs), target).backward()
        optimizer.step()
        time.sleep(seconds)

    return train_step


def _workload(dataset: Any, name: str, step_seconds: float = STEP_SECONDS) -> batchfit.Workload:
    model = tiny_model()
    return batchfit.Workload(
        model=model,
        optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
        dataset=dataset,
        train_step=device_step(step_seconds),
        name=name,
    )


def sleepy() -> batchfit.Workload:
    return _workload(SleepyItems(), "sleepy")


def heavy() -> batchfit.Workload:
    return _workload(HeavyItems(), "heavy")


def fast(device: torch.device | None = None) -> batchfit.Workload:
    """In-memory data and a real step of a wider model, all of it computed: the step is the work.
    On ``device`` where given (``--workload data_workloads:fast --device cuda`` passes it)."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(32, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 4)
    ).to(device or "cpu")
    return batchfit.Workload(
        model=model,
        optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
        dataset=InMemoryItems(),
        loss_fn=nn.functional.cross_entropy,
        name="fast",
    )


def small() -> batchfit.Workload:
    """A dataset of 10 items: fewer than a batch of 32."""
    return _workload(SleepyItems(length=10), "small")


def sleepy_loader(batch_size: int, num_workers: int) -> DataLoader[Any]:
    """A loader factory that takes only batch_size and num_workers: only those are varied."""
    return DataLoader(SleepyItems(), batch_size=batch_size, num_workers=num_workers, shuffle=True)


def loader_without_batch_size(num_workers: int) -> DataLoader[Any]:
    return DataLoader(SleepyItems(), batch_size=8, num_workers=num_workers)


def loader_ignoring_batch_size(batch_size: int, num_workers: int) -> DataLoader[Any]:
    return DataLoader(SleepyItems(), batch_size=8, num_workers=num_workers)


def stream_loader(batch_size: int) -> DataLoader[Any]:
    return DataLoader(Stream(), batch_size=batch_size)

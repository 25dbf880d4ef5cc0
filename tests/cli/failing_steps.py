"""Targets for ``batchfit find --workload failing_steps:FUNCTION`` in test_cli_step_errors.py: steps
that raise, diverge or wait, as a user's own code does.

The CLI imports this module from its working directory (tests/cli/), so it must stay importable on
its own: torch and batchfit only.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch
from torch import nn

import batchfit


def _perceptron() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))


def _make_batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(n)
    return torch.randn(n, 32, generator=generator), torch.randint(0, 4, (n,), generator=generator)


def mismatched_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Cross-entropy on half the targets: the batch sizes do not match."""
    half = target[: target.shape[0] // 2]
    return nn.functional.cross_entropy(output, half)


def shape_mismatch() -> batchfit.Workload:
    """The perceptron whose loss compares a batch's outputs with half its targets."""
    model = _perceptron()
    return batchfit.Workload(
        model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        make_batch=_make_batch,
        loss_fn=mismatched_loss,
        name="shape-mismatch",
    )


def nan_loss() -> batchfit.Workload:
    """The perceptron whose loss is NaN: the square root of a negative number."""
    model = _perceptron()

    def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(output, target) + torch.sqrt(torch.tensor(-1.0))

    return batchfit.Workload(
        model=model,
        optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3),
        make_batch=_make_batch,
        loss_fn=loss_fn,
        name="nan-loss",
    )


def slow_step() -> batchfit.Workload:
    """The perceptron whose train step, run for real, touches the file named by ``BATCHFIT_TEST_MARK``
    and then sleeps: a test sends Ctrl-C (SIGINT) while it does. The step reads its loss (as a
    logging step does), so it cannot be traced on fake tensors: only real steps run."""
    model = _perceptron()
    mark = Path(os.environ["BATCHFIT_TEST_MARK"])

    def train_step(
        model: nn.Module, optimizer: torch.optim.Optimizer, batch: tuple[torch.Tensor, ...]
    ) -> None:
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(batch[0]), batch[1])
        float(loss)  # read, as a logging step reads it
        mark.touch()
        time.sleep(60)
        loss.backward()
        optimizer.step()

    return batchfit.Workload(
        model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        make_batch=_make_batch,
        train_step=train_step,
        name="slow-step",
    )

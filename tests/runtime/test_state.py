"""Snapshot and restore: in place, bit for bit, whatever a trial did."""

from __future__ import annotations

import random

import torch
from torch import nn

from batchfit.runtime.state import TrainingSnapshot


def test_restore_undoes_a_training_step_in_place() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    weight = model[0].weight
    weight_before = weight.detach().clone()
    stats_before = model[1].running_mean.clone()
    snapshot = TrainingSnapshot.capture(model, optimizer)

    model(torch.randn(16, 4)).sum().backward()  # a trial: new gradients, state, statistics
    optimizer.step()
    optimizer.param_groups[0]["lr"] = 0.5  # a scheduler inside a user's train_step
    model.eval()
    torch.rand(1), random.random()

    snapshot.restore()
    assert model[0].weight is weight and torch.equal(weight, weight_before)
    assert torch.equal(model[1].running_mean, stats_before) and int(model[1].num_batches_tracked) == 0
    assert optimizer.state == {} and optimizer.param_groups[0]["lr"] == 1e-2
    assert all(p.grad is None for p in model.parameters()) and model.training


def test_existing_optimizer_state_and_gradients_come_back() -> None:
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(3, 4)).sum().backward()
    optimizer.step()
    momentum = optimizer.state[model.weight]["momentum_buffer"]
    saved_momentum, saved_grad = momentum.clone(), model.weight.grad.clone()  # type: ignore[union-attr]
    snapshot = TrainingSnapshot.capture(model, optimizer)
    snapshot.set_gradients_aside()
    assert model.weight.grad is None  # a trial starts as a step does, after zero_grad
    for _ in range(3):
        model(torch.randn(5, 4)).sum().backward()
        optimizer.step()
    snapshot.restore(gradients=False)
    assert model.weight.grad is None and optimizer.state[model.weight]["momentum_buffer"] is momentum
    assert torch.equal(momentum, saved_momentum)
    snapshot.restore()
    assert torch.equal(model.weight.grad, saved_grad)  # type: ignore[arg-type]

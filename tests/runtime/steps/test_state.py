"""Snapshot and restore: in place, bit for bit, whatever a trial did, the step's GradScalers too."""

from __future__ import annotations

import copy
import gc
import random
import weakref

import torch
from torch import nn

from batchfit.runtime.steps.reach import step_state
from batchfit.runtime.steps.state import TrainingSnapshot


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


def test_optimizer_state_a_step_replaces_is_freed_and_comes_back() -> None:
    # L-BFGS replaces its direction and keeps its history in lists of tensors. The snapshot holds
    # copies on the host and the originals weakly: what the steps replace is freed, as in training.
    torch.manual_seed(0)
    model = nn.Linear(8, 4)
    optimizer = torch.optim.LBFGS(model.parameters(), history_size=3, max_iter=2)
    inputs = torch.randn(6, 8)

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = model(inputs).pow(2).mean()
        loss.backward()
        return loss

    for _ in range(3):
        optimizer.step(closure)
    state = optimizer.state[model.weight]
    before = copy.deepcopy(optimizer.state_dict())
    direction, history = weakref.ref(state["d"]), [weakref.ref(t) for t in state["old_dirs"]]
    snapshot = TrainingSnapshot.capture(model, optimizer)
    for _ in range(4):
        optimizer.step(closure)
    gc.collect()
    assert direction() is None and all(ref() is None for ref in history)  # freed, as in training
    snapshot.restore()

    def same(a: object, b: object) -> bool:
        if isinstance(a, torch.Tensor):
            return isinstance(b, torch.Tensor) and torch.equal(a, b)
        if isinstance(a, list):
            return isinstance(b, list) and len(a) == len(b) and all(map(same, a, b))
        return a == b

    after = optimizer.state_dict()["state"]
    assert after.keys() == before["state"].keys()
    assert all(same(value, after[0][name]) for name, value in before["state"][0].items())


def test_a_buffer_assigned_anew_is_freed_and_comes_back() -> None:
    model = nn.BatchNorm1d(4)
    model.register_buffer("queue", torch.arange(8.0))
    weight, queue = model.weight, weakref.ref(model.queue)
    snapshot = TrainingSnapshot.capture(model, None)
    model.queue = model.queue + 1  # what a forward may do: the old buffer is freed
    gc.collect()
    assert queue() is None
    with torch.no_grad():
        model.weight.add_(1)
    snapshot.restore()
    assert torch.equal(model.queue, torch.arange(8.0)) and model.queue.device == torch.device("cpu")
    assert model.weight is weight and torch.equal(model.weight, torch.ones(4))  # the same object, filled


SCALER_OF_THE_MODULE = torch.amp.GradScaler("cpu")


def scaled_step(scaler: torch.amp.GradScaler, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """One mixed-precision step as training runs it: float16 autocast, the loss scaled."""
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.float16):
        loss = model(torch.randn(4, 4)).float().pow(2).mean()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()


class Trainer:
    def __init__(self) -> None:
        self.scaler = torch.amp.GradScaler("cpu")

    def train_step(self, model: nn.Module, optimizer: torch.optim.Optimizer, batch: object) -> None:
        scaled_step(self.scaler, model, optimizer)


def test_a_scaler_comes_back_as_it_was_lazy_or_scaled() -> None:
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    trainer = Trainer()
    snapshot = TrainingSnapshot.capture(model, optimizer, [trainer.train_step])
    for _ in range(3):
        trainer.train_step(model, optimizer, None)
    assert trainer.scaler._scale is not None
    snapshot.restore()
    # Never stepped: its scale is made at its first step again, on the step's device.
    assert trainer.scaler._scale is None and trainer.scaler._growth_tracker is None

    trainer.train_step(model, optimizer, None)  # a scaler in the middle of training: its scale, in place
    trainer.scaler.update(1024.0)
    scale, tracker = trainer.scaler._scale, trainer.scaler._growth_tracker
    assert tracker is not None
    good_steps = int(tracker)
    snapshot = TrainingSnapshot.capture(model, optimizer, [trainer.train_step])
    for _ in range(3):
        trainer.train_step(model, optimizer, None)
    trainer.scaler.update(8.0)
    snapshot.restore()
    assert trainer.scaler._scale is scale and trainer.scaler._growth_tracker is tracker
    assert trainer.scaler.get_scale() == 1024.0 and int(tracker) == good_steps
    assert dict(trainer.scaler._per_optimizer_states) == {}


def test_between_trials_a_scaler_keeps_its_scale_and_drops_a_step_cut_short() -> None:
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    trainer = Trainer()
    snapshot = TrainingSnapshot.capture(model, optimizer, [trainer.train_step])
    trainer.train_step(model, optimizer, None)
    trainer.scaler.update(256.0)  # the scale came down, as after steps skipped for overflow
    with torch.autocast("cpu", dtype=torch.float16):
        trainer.scaler.scale(model(torch.randn(4, 4)).float().sum()).backward()
    trainer.scaler.unscale_(optimizer)  # an out-of-memory here leaves the step half done
    snapshot.restore(gradients=False, scales=False)
    assert trainer.scaler.get_scale() == 256.0 and dict(trainer.scaler._per_optimizer_states) == {}
    trainer.train_step(model, optimizer, None)  # the next trial's step runs (no "unscale_ already called")
    snapshot.restore()
    assert trainer.scaler._scale is None


def test_the_modules_and_optimizers_a_step_reaches_beside_the_model_come_back() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    critic = nn.Sequential(nn.Linear(2, 8), nn.Dropout(0.5), nn.Linear(8, 1))
    critic_optimizer = torch.optim.Adam(critic.parameters(), lr=1e-2)
    critic(torch.randn(3, 2)).sum().backward()  # the user's training so far: state and gradients
    critic_optimizer.step()
    critic.eval()
    loss = nn.MSELoss()  # a module without parameters or buffers: nothing of its own to put back

    def train_step(m: nn.Module, opt: torch.optim.Optimizer, batch: torch.Tensor) -> None:
        output = model(batch)  # the model by name, its first layer too: the model's own state
        (loss(output, torch.zeros_like(output)) + critic(output).mean() + model[0].weight.sum()).backward()
        opt.step()
        critic.train()
        critic(output.detach()).sum().backward()
        critic_optimizer.step()

    assert step_state(model, optimizer, [train_step]) == [critic, critic_optimizer]
    saved = {
        "weights": {k: v.clone() for k, v in critic.state_dict().items()},
        "grads": [p.grad.clone() for p in critic.parameters()],
        "state": copy.deepcopy(critic_optimizer.state_dict()),
    }
    exp_avg = critic_optimizer.state[critic[0].weight]["exp_avg"]
    snapshot = TrainingSnapshot.capture(model, optimizer, [train_step])
    for _ in range(3):
        train_step(model, optimizer, torch.randn(5, 4))
    snapshot.restore()
    assert all(torch.equal(v, saved["weights"][k]) for k, v in critic.state_dict().items())
    assert all(torch.equal(p.grad, g) for p, g in zip(critic.parameters(), saved["grads"], strict=True))
    restored = critic_optimizer.state_dict()
    assert restored["param_groups"] == saved["state"]["param_groups"]
    for key, state in saved["state"]["state"].items():
        assert all(torch.equal(restored["state"][key][name], value) for name, value in state.items())
    assert critic_optimizer.state[critic[0].weight]["exp_avg"] is exp_avg  # in place
    assert not critic.training

"""What a step reaches beside the model and optimizer: its GradScalers wherever it keeps them, and
the other modules and optimizers it steps, the model under any wrapper left out."""

from __future__ import annotations

import functools

import torch
from test_state import SCALER_OF_THE_MODULE, Trainer, scaled_step
from torch import nn

from batchfit.runtime.steps.reach import grad_scalers, step_state


def test_the_scalers_a_step_uses_are_found_wherever_it_keeps_them() -> None:
    in_closure, in_default = torch.amp.GradScaler("cpu"), torch.amp.GradScaler("cpu")

    def closure_step(model: nn.Module, optimizer: torch.optim.Optimizer, batch: object) -> None:
        scaled_step(in_closure, model, optimizer)

    def default_step(model: nn.Module, optimizer: object, batch: object, s: object = in_default) -> None:
        del model, optimizer, batch, s

    def global_step(model: nn.Module, optimizer: torch.optim.Optimizer, batch: object) -> None:
        scaled_step(SCALER_OF_THE_MODULE, model, optimizer)

    trainer = Trainer()
    partial = functools.partial(scaled_step, in_default)
    assert grad_scalers(closure_step) == [in_closure]
    assert grad_scalers(default_step) == [in_default]
    assert grad_scalers(global_step) == [SCALER_OF_THE_MODULE]
    assert grad_scalers(trainer.train_step) == [trainer.scaler]
    assert grad_scalers(partial, None, closure_step) == [in_default, in_closure]
    assert grad_scalers(None) == [] and grad_scalers(lambda model, batch: model(batch)) == []


def test_step_state_leaves_out_the_model_under_any_wrapper() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    wrapped = nn.ModuleDict({"inner": model})  # the model's own tensors, held another way
    head = model[1]

    def step(m: nn.Module, opt: torch.optim.Optimizer, batch: torch.Tensor) -> None:
        wrapped["inner"](batch).sum().backward()
        head.weight.grad = None
        opt.step()

    assert step_state(model, optimizer, [step]) == []

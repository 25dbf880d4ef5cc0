"""Steps that do not train stop the search: a non-finite loss, gradients without a GradScaler, or
parameters; a GradScaler's skipped steps do not."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from tiny_workloads import build
from torch import nn

from batchfit import BatchSizes, Trials, Workload, find_batch_size
from batchfit.errors import NonFiniteError
from batchfit.runtime.steps.finite import WHAT_TO_CHECK, loss_in
from batchfit.runtime.workloads.examples import build_example

EIGHT = BatchSizes(min_batch_size=8, max_batch_size=8)  # one candidate: the trial that fails is known


def _nan_gradient(weight: torch.Tensor) -> torch.Tensor:
    """0 in value, NaN in gradient: the square root's gradient at 0 is inf, times 0."""
    return 0 * torch.sqrt(weight - weight.detach()).sum()


def _weights(workload: Workload) -> dict[str, torch.Tensor]:
    return {name: tensor.clone() for name, tensor in workload.model.state_dict().items()}


def _find_raises(workload: Workload, mode: str = "train", trials: Trials = Trials()) -> str:
    before = _weights(workload)
    with pytest.raises(NonFiniteError) as info:
        find_batch_size(workload, mode, device="cpu", memory_limit="64MiB", sizes=EIGHT, trials=trials)  # type: ignore[arg-type]
    assert isinstance(info.value, FloatingPointError)
    after = _weights(workload)  # put back, bit for bit, as after any trial
    assert all(torch.equal(before[name], after[name]) for name in before)
    return str(info.value)


@pytest.mark.parametrize(
    ("mode", "addend", "value"),
    [("train", math.nan, "nan"), ("train", math.inf, "inf"), ("eval", math.nan, "nan")],
)
def test_a_non_finite_loss_stops_the_search_naming_the_batch_and_the_step(
    mode: str, addend: float, value: str
) -> None:
    workload = build("mlp")
    # A constant added: the gradients stay finite, so only the loss itself shows it.
    workload.loss_fn = lambda output, target: nn.functional.cross_entropy(output, target) + addend
    assert _find_raises(workload, mode) == (
        f"the {mode} step's loss is {value} at batch_size=8, step 1 of 2; batchfit does not answer from "
        f"steps that do not train. {WHAT_TO_CHECK}"
    )


def test_non_finite_gradients_without_a_grad_scaler_stop_the_search() -> None:
    workload = build("mlp")
    model = workload.model

    def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(output, target) + _nan_gradient(model[0].weight)

    workload.loss_fn = loss_fn
    # One step a trial: its loss is finite, its gradients are not (a second step's loss would be NaN).
    assert _find_raises(workload, trials=Trials(steps_per_trial=1)) == (
        "the gradients of '0.weight' are not finite (NaN or inf) after the train step at batch_size=8, "
        "step 1 of 1 (the trial's last), and no GradScaler skips the steps they overflow: the optimizer "
        f"steps on them. {WHAT_TO_CHECK}"
    )


def test_parameters_an_optimizer_made_non_finite_stop_the_search() -> None:
    workload = build("mlp")

    def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, batch: Any) -> None:
        loss = nn.functional.cross_entropy(model(batch[0]), batch[1]) + _nan_gradient(model[0].weight)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)  # nothing returned, no gradient left: the weights show it

    workload.train_step = train_step
    assert _find_raises(workload) == (
        "the parameters '0.weight', '0.bias', '2.weight' and 3 more are not finite (NaN or inf) after "
        "the train step at batch_size=8, step 2 of 2 (the trial's last): an optimizer step took "
        f"non-finite gradients, or they were so before the search. {WHAT_TO_CHECK}"
    )


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_a_grad_scaler_s_skipped_steps_are_not_an_error(device: str) -> None:
    workload = build("mlp") if device == "cpu" else build_example("mlp", device)
    # Every step that succeeds grows the scale 2**20-fold, so the next overflows in float16 and is
    # skipped (its gradients inf), which brings the scale back: each trial ends on a skipped step.
    scaler = torch.amp.GradScaler(device, growth_factor=2.0**20, backoff_factor=2.0**-20, growth_interval=1)
    skipped: list[bool] = []

    def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, batch: Any) -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device, dtype=torch.float16):
            loss = nn.functional.cross_entropy(model(batch[0]), batch[1])
        scale = scaler.get_scale()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        skipped.append(scaler.get_scale() < scale)
        return loss  # unscaled: finite

    workload.train_step = train_step
    limit = "64MiB" if device == "cpu" else "1GiB"  # CUDA's context and cuBLAS's workspaces besides
    result = find_batch_size(workload, device=device, memory_limit=limit, sizes=EIGHT)
    assert result.batch_size == 8 and any(skipped) and not all(skipped)
    if device == "cpu":
        assert skipped[-1] and not skipped[-2]  # the last trial's second step was skipped, its first taken


class _Output:
    def __init__(self, loss: Any) -> None:
        self.loss = loss


LOSS = torch.tensor(2.5, requires_grad=True) * 1


@pytest.mark.parametrize(
    ("returned", "expected"),
    [
        pytest.param(LOSS, LOSS, id="scalar-tensor"),
        pytest.param(2.5, 2.5, id="float"),
        pytest.param({"loss": LOSS, "logits": torch.zeros(3)}, LOSS, id="mapping"),
        pytest.param(_Output(LOSS), LOSS, id="attribute"),
        pytest.param(torch.zeros(3), None, id="per-sample"),
        pytest.param(torch.tensor(3), None, id="integer"),
        pytest.param(None, None, id="none"),
        pytest.param(SimpleNamespace(), None, id="no-loss"),
    ],
)
def test_the_loss_is_read_from_what_a_step_returns(returned: Any, expected: Any) -> None:
    assert loss_in(returned) is expected

"""noise_scale on real models against exact answers: linear least squares, whose per-example
gradients are closed-form, at three noise levels, and a small MLP, whose per-example gradients
torch.func gives over the whole dataset; state put back bit for bit; and its errors."""

from __future__ import annotations

import json
import math
import random

import pytest
import torch
from torch import nn
from torch.func import functional_call, grad, vmap

import batchfit
from batchfit import ConfigurationError, Sampling, Workload
from batchfit.errors import NonFiniteError

DIMENSIONS, SAMPLES = 8, 20_000


def with_replacement(inputs: torch.Tensor, targets: torch.Tensor):  # type: ignore[no-untyped-def]
    """A make_batch drawing its samples independently, with replacement: the estimator's
    assumption, so its mean is exactly the dataset's noise scale."""

    def make_batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        drawn = torch.randint(len(inputs), (n,))
        return inputs[drawn], targets[drawn]

    return make_batch


def exact_noise_scale(per_example: torch.Tensor) -> float:
    """tr(Sigma) / |G|^2 over the dataset, from every example's gradient (one row each)."""
    mean = per_example.mean(0)
    return ((per_example - mean).square().sum(1).mean() / mean.square().sum()).item()


def least_squares(noise: float) -> tuple[Workload, float]:
    """Linear regression, y = x . 1 + noise x e, at a point off the optimum: the loss 0.5 (x . w - y)^2
    has per-example gradients (x . w - y) x, so the dataset's noise scale is exact (about 9 + 8 x
    noise^2 / |w - 1|^2)."""
    gen = torch.Generator().manual_seed(0)
    inputs = torch.randn(SAMPLES, DIMENSIONS, generator=gen, dtype=torch.float64)
    targets = inputs.sum(1) + noise * torch.randn(SAMPLES, generator=gen, dtype=torch.float64)
    model = nn.Linear(DIMENSIONS, 1, bias=False).double()
    with torch.no_grad():
        model.weight.copy_(1 + torch.randn(1, DIMENSIONS, generator=gen, dtype=torch.float64) / 3)
    per_example = (inputs @ model.weight.detach()[0] - targets)[:, None] * inputs

    def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return 0.5 * (output[:, 0] - target).square().mean()

    workload = Workload(model=model, make_batch=with_replacement(inputs, targets), loss_fn=loss_fn)
    return workload, exact_noise_scale(per_example)


@pytest.mark.parametrize(
    ("noise", "batch_size", "micro_batch_size", "exact"),
    [(0.0, 64, 8, 9.03), (16.0, 4096, 512, 988.4), (51.0, 32768, 4096, 9101)],
)
def test_least_squares_at_a_fixed_point_is_exact(
    noise: float, batch_size: int, micro_batch_size: int, exact: float
) -> None:
    """At B_noise about 10, 1,000 and 10,000 (batches around it), 400 steps at fixed weights land
    within 5% of the exact value, and the 90% interval covers it."""
    workload, truth = least_squares(noise)
    assert truth == pytest.approx(exact, rel=1e-3)
    torch.manual_seed(0)
    sampling = Sampling(batch_size, micro_batch_size=micro_batch_size, steps=400, fixed_weights=True)
    result = batchfit.noise_scale(workload, sampling=sampling, device="cpu")
    scale = result.estimate
    assert scale.b_simple == pytest.approx(truth, rel=0.05)
    assert scale.low is not None and scale.high is not None and scale.low <= truth <= scale.high
    assert (scale.steps, scale.small_batch_size, scale.big_batch_size) == (400, micro_batch_size, batch_size)


def test_a_small_mlp_at_a_checkpoint_matches_its_per_example_gradients() -> None:
    """A 10-32-3 tanh MLP on synthetic classes, trained 30 steps (the checkpoint): the truth is the
    dataset's per-example gradients from torch.func; 300 steps of 256 against 32 land within 10%
    and the interval covers it."""
    gen = torch.Generator().manual_seed(0)
    inputs = torch.randn(4096, 10, generator=gen, dtype=torch.float64)
    labels = (inputs[:, :3].sum(1) > 0).long() + (inputs[:, 3] > 1).long()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 32), nn.Tanh(), nn.Linear(32, 3)).double()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(30):
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(inputs[:256]), labels[:256]).backward()
        optimizer.step()
    weights = {name: value.detach() for name, value in model.named_parameters()}

    def example_loss(params: dict[str, torch.Tensor], one: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(functional_call(model, params, (one[None],)), label[None])

    per_example = vmap(grad(example_loss), in_dims=(None, 0, 0))(weights, inputs, labels)
    truth = exact_noise_scale(torch.cat([value.reshape(4096, -1) for value in per_example.values()], 1))
    workload = Workload(
        model=model, make_batch=with_replacement(inputs, labels), loss_fn=nn.functional.cross_entropy
    )
    torch.manual_seed(0)
    sampling = Sampling(256, micro_batch_size=32, steps=300, fixed_weights=True)
    scale = batchfit.noise_scale(workload, sampling=sampling, device="cpu").estimate
    assert scale.b_simple == pytest.approx(truth, rel=0.10)
    assert scale.low is not None and scale.high is not None and scale.low <= truth <= scale.high


def tiny_classifier(**changes: object) -> Workload:
    """A 16-32-4 MLP with AdamW (state made by one step first) on fresh random batches."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(8, 16)).sum().backward()
    optimizer.step()

    def make_batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(n, 16), torch.randint(0, 4, (n,))

    fields: dict[str, object] = {
        "model": model,
        "optimizer": optimizer,
        "make_batch": make_batch,
        "loss_fn": nn.functional.cross_entropy,
    }
    return Workload(**{**fields, **changes})  # type: ignore[arg-type]


def test_training_steps_are_put_back_exactly() -> None:
    """After 5 training steps (the weights and Adam's state move), the weights, gradients, optimizer
    state and settings, the RNGs and the modes are as found, bit for bit; the result is JSON."""
    workload = tiny_classifier()
    model, optimizer = workload.model, workload.optimizer
    assert isinstance(optimizer, torch.optim.Optimizer)
    model.eval()
    weights = {name: value.clone() for name, value in model.state_dict().items()}
    grads = [p.grad.clone() for p in model.parameters()]
    state = {
        key: {name: value.clone() for name, value in each.items()} for key, each in optimizer.state.items()
    }
    rngs = (torch.get_rng_state(), random.getstate())
    heard: list[str] = []

    sampling = Sampling(64, accumulation_steps=4, steps=5)
    result = batchfit.noise_scale(workload, sampling=sampling, on_progress=lambda e: heard.append(e.message))

    assert all(torch.equal(value, weights[name]) for name, value in model.state_dict().items())
    assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), grads, strict=True))
    for key, each in optimizer.state.items():
        assert all(torch.equal(value, state[key][name]) for name, value in each.items())
    assert torch.equal(torch.get_rng_state(), rngs[0]) and random.getstate() == rngs[1]
    assert not model.training
    assert (result.micro_batch_size, result.accumulation_steps, len(result.readings)) == (16, 4, 5)
    assert heard[0].startswith("noise-scale step 1/5: ") and len(heard) == 5
    document = json.loads(json.dumps(result.to_dict()))
    assert document["noise_scale"]["steps"] == 5 and document["batch_size"] == 64
    assert result.summary().startswith(("B_simple = ", "B_simple not resolved"))


def test_the_steps_train_between_readings() -> None:
    """Without fixed_weights the optimizer steps: the second reading is taken at other weights (the
    same seed at fixed weights gives the same first reading and another second)."""
    sampling = Sampling(32, micro_batch_size=8, steps=2)
    torch.manual_seed(1)
    trained = batchfit.noise_scale(tiny_classifier(), sampling=sampling).readings
    torch.manual_seed(1)
    fixed = batchfit.noise_scale(
        tiny_classifier(), sampling=Sampling(32, micro_batch_size=8, steps=2, fixed_weights=True)
    ).readings
    assert trained[0] == fixed[0] and trained[1] != fixed[1]


def test_a_dataset_is_drawn_at_random() -> None:
    """From a dataset each step draws batch_size items at random, so two steps read other samples."""
    dataset = torch.utils.data.TensorDataset(torch.randn(512, 16), torch.randint(0, 4, (512,)))
    workload = tiny_classifier(make_batch=None, dataset=dataset)
    sampling = Sampling(64, micro_batch_size=16, steps=3, fixed_weights=True)
    readings = batchfit.noise_scale(workload, sampling=sampling).readings
    assert len({reading.big_norm_sq for reading in readings}) == 3


@pytest.mark.parametrize(
    ("sampling", "message"),
    [
        (
            Sampling(64, micro_batch_size=64),
            (
                "micro_batch_size (64) equals batch_size (64), so the small batch is the big one and the "
                "two give no noise scale; pass a micro_batch_size below it that divides it, such as 32."
            ),
        ),
        (
            Sampling(60),
            (
                "on one device the noise scale compares micro-batches with the batch of 60 they add up "
                "to: pass micro_batch_size (a divisor of 60 below it, such as 30) or accumulation_steps."
            ),
        ),
        (
            Sampling(64, micro_batch_size=24),
            (
                "micro_batch_size x accumulation_steps (24 x 2) must equal the batch each of 1 device(s) "
                "trains (64 of batch_size 64); pass one of them and batchfit derives the other."
            ),
        ),
    ],
)
def test_sizes_that_give_no_noise_scale_are_refused(sampling: Sampling, message: str) -> None:
    with pytest.raises(ConfigurationError) as raised:
        batchfit.noise_scale(tiny_classifier(), sampling=sampling)
    assert str(raised.value) == message


def test_a_frozen_model_is_refused() -> None:
    workload = tiny_classifier()
    workload.model.requires_grad_(False)
    with pytest.raises(
        ConfigurationError, match=r"^no parameter requires a gradient \(every one is frozen\)"
    ):
        batchfit.noise_scale(workload, sampling=Sampling(32, micro_batch_size=8, fixed_weights=True))


def test_a_train_step_of_its_own_is_refused() -> None:
    workload = tiny_classifier(train_step=lambda model, optimizer, batch: None)
    with pytest.raises(ConfigurationError, match=r"^Workload.train_step does its own backward and optimizer"):
        batchfit.noise_scale(workload, sampling=Sampling(32, micro_batch_size=8))


def test_a_non_finite_loss_stops_it_and_state_comes_back() -> None:
    """A loss that turns inf at the third step raises NonFiniteError naming it; the weights are back."""
    calls = [0]

    def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        calls[0] += 1
        loss = nn.functional.cross_entropy(output, target)
        return loss * math.inf if calls[0] == 9 else loss

    workload = tiny_classifier(loss_fn=loss_fn)
    weights = {name: value.clone() for name, value in workload.model.state_dict().items()}
    with pytest.raises(NonFiniteError) as raised:
        batchfit.noise_scale(workload, sampling=Sampling(32, micro_batch_size=8, steps=5))
    assert str(raised.value).startswith(
        "the train step's loss is not finite (NaN or inf) at batch_size=32, step 3; the noise scale is "
        "read from steps that train."
    )
    assert all(torch.equal(value, weights[name]) for name, value in workload.model.state_dict().items())


def test_a_make_batch_that_repeats_itself_is_told() -> None:
    """The built-in examples' make_batch returns the same batch for a size: the note says what that
    measures and what to do; fresh batches hear no note."""
    fixed = torch.randn(32, 16), torch.randint(0, 4, (32,))
    notes: list[str] = []
    sampling = Sampling(32, micro_batch_size=8, steps=3, fixed_weights=True)
    batchfit.noise_scale(
        tiny_classifier(make_batch=lambda n: fixed),
        sampling=sampling,
        on_progress=lambda event: notes.append(event.message) if event.stage == "note" else None,
    )
    assert len(notes) == 1
    assert notes[0].startswith("the first two steps drew the same batch: the noise scale is then")
    heard: list[str] = []
    batchfit.noise_scale(tiny_classifier(), sampling=sampling, on_progress=lambda e: heard.append(e.stage))
    assert "note" not in heard

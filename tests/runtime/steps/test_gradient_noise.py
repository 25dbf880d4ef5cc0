"""AccumulationNoise on a real model: its reading equals the per-micro-batch gradients computed one
by one, whichever way the loss is divided, with a GradScaler's scale divided out and its skipped
steps left out; and its errors."""

from __future__ import annotations

import pytest
import torch
from micro_batch_helpers import make_batch, make_model
from torch import nn

from batchfit import ConfigurationError
from batchfit.runtime.steps.gradient_noise import AccumulationNoise

MICRO, COUNT = 16, 4


def micro_gradients(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> list[torch.Tensor]:
    """Each micro-batch's own gradient of its mean loss, flattened, computed alone: the truth."""
    flat = []
    for index in range(COUNT):
        model.zero_grad(set_to_none=True)
        part = slice(index * MICRO, (index + 1) * MICRO)
        nn.functional.cross_entropy(model(batch[0][part]), batch[1][part]).backward()
        flat.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    model.zero_grad(set_to_none=True)
    return flat


def accumulate(
    model: nn.Module,
    batch: tuple[torch.Tensor, torch.Tensor],
    noise: AccumulationNoise,
    *,
    divided: bool,
    scaler: torch.amp.GradScaler | None = None,
    poison: bool = False,
) -> None:
    """One step's backwards, micro-batch by micro-batch, as training accumulates them."""
    for index in range(COUNT):
        part = slice(index * MICRO, (index + 1) * MICRO)
        loss = nn.functional.cross_entropy(model(batch[0][part]), batch[1][part])
        loss = loss / COUNT if divided else loss
        if poison and index == 2:
            loss = loss * float("inf")
        (scaler.scale(loss) if scaler is not None else loss).backward()
        noise.after_backward()


@pytest.mark.parametrize("divided", [True, False])
def test_a_reading_is_the_micro_batches_against_their_mean(divided: bool) -> None:
    """Two steps in a row (the second starts from the first's zeroed gradients): small is the mean of
    the micro-batches' squared norms, big the squared norm of their mean, each of the mean loss."""
    model = make_model()
    noise = AccumulationNoise(model.parameters(), MICRO, loss_divided=divided)
    for seed in (1, 2):
        batch = make_batch(MICRO * COUNT, seed=seed)
        truth = micro_gradients(model, batch)
        accumulate(model, batch, noise, divided=divided)
        reading = noise.end_step()
        model.zero_grad(set_to_none=seed == 1)  # None, then zeros: both start a step afresh
        assert reading is not None
        assert (reading.small_batch_size, reading.big_batch_size) == (MICRO, MICRO * COUNT)
        small = torch.stack([g.square().sum() for g in truth]).mean().item()
        big = torch.stack(truth).mean(0).square().sum().item()
        assert reading.small_norm_sq == pytest.approx(small, rel=1e-10)
        assert reading.big_norm_sq == pytest.approx(big, rel=1e-10)
    assert len(noise.readings) == 2 and noise.skipped == 0


def test_a_grad_scaler_is_divided_out_and_its_skipped_step_not_counted() -> None:
    """Under a real GradScaler on the CPU (scale 1024), the reading is the unscaled one; a step whose
    loss overflows gives none, and the scaler skips it too (its scale halves)."""
    model = make_model()
    plain = AccumulationNoise(model.parameters(), MICRO)
    accumulate(model, make_batch(MICRO * COUNT, seed=3), plain, divided=True)
    expected = plain.end_step()
    model.zero_grad(set_to_none=True)

    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    noise = AccumulationNoise(model.parameters(), MICRO, scaler=scaler)
    accumulate(model, make_batch(MICRO * COUNT, seed=3), noise, divided=True, scaler=scaler)
    reading = noise.end_step()
    assert reading is not None and expected is not None
    assert reading.small_norm_sq == pytest.approx(expected.small_norm_sq, rel=1e-10)
    assert reading.big_norm_sq == pytest.approx(expected.big_norm_sq, rel=1e-10)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad()

    accumulate(model, make_batch(MICRO * COUNT, seed=4), noise, divided=True, scaler=scaler, poison=True)
    assert noise.end_step() is None
    scaler.step(optimizer)
    scaler.update()
    assert scaler.get_scale() == 512.0  # the scaler skipped the same step
    assert noise.readings == [reading] and noise.skipped == 1


def test_a_frozen_model_has_no_gradient_to_read() -> None:
    model = make_model().requires_grad_(False)
    with pytest.raises(ConfigurationError) as raised:
        AccumulationNoise(model.parameters(), MICRO)
    assert str(raised.value) == (
        "no parameter requires a gradient (every one is frozen), so there is no gradient to read the "
        "noise scale from; unfreeze the parameters the run trains (requires_grad=True)."
    )


def test_one_micro_batch_is_no_comparison() -> None:
    """A step of one micro-batch: its small batch is its big one."""
    model = make_model()
    noise = AccumulationNoise(model.parameters(), MICRO)
    batch = make_batch(MICRO)
    nn.functional.cross_entropy(model(batch[0]), batch[1]).backward()
    noise.after_backward()
    with pytest.raises(ConfigurationError, match=r"^the step ran 1 micro-batch\(es\); the noise scale"):
        noise.end_step()

"""MicroBatchStep gives the user's own step (one forward of the whole batch with their loss, backward,
optimizer step) for a mean, a sum and a token-mean loss, at every micro-batch and after real
out-of-memory halvings; a loss or gradient that is not finite raises or skips, never steps; the
batch schedule's growth is the user's step at the grown batch and the scaled learning rate."""

from __future__ import annotations

import copy
import functools
import logging
import math
import re
from collections.abc import Callable

import pytest
import torch
from micro_batch_helpers import (
    assert_same_step,
    make_batch,
    make_model,
    make_token_batch,
    make_token_model,
    sgd_plain,
    step_peak_bytes,
    stepped_gradients,
    users_step,
)
from torch import nn

import batchfit
from batchfit import MicroBatchOptions, MicroBatchStep
from batchfit.errors import NonFiniteError
from batchfit.policy.plan.batch_schedule import BatchSchedule
from batchfit.policy.plan.noise_monitor import NoiseScaleMonitor
from batchfit.runtime.steps.finite import WHAT_TO_CHECK

cross_entropy = nn.functional.cross_entropy
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def summed_cross_entropy(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return cross_entropy(output, target, reduction="sum")


#: (the user's loss, what is declared to MicroBatchStep, what it honours).
REDUCTIONS = {
    "mean, the default": (cross_entropy, None, "mean"),
    "sum, declared": (summed_cross_entropy, "sum", "sum"),
    "sum, read from the module": (nn.CrossEntropyLoss(reduction="sum"), None, "sum"),
    "token mean, read from the module": (nn.CrossEntropyLoss(), None, "token_mean"),
    "token mean, declared": (cross_entropy, "token_mean", "token_mean"),
}


@pytest.mark.parametrize("micro_batch_size", [24, 7, 1])
@pytest.mark.parametrize("case", list(REDUCTIONS))
def test_one_step_is_the_users_step_for_every_reduction(case: str, micro_batch_size: int) -> None:
    """24 sequences of 0 to 6 tokens (padding ignored) as one micro-batch, as 7+7+7+3, and as 24 of
    one (a sequence without tokens among them): the gradients stepped on, the parameters after the
    step and the loss are the user's, to 1e-10."""
    loss_fn, reduction, honoured = REDUCTIONS[case]
    token = honoured == "token_mean"
    make = make_token_model if token else make_model
    batch = make_token_batch(24) if token else make_batch(24)
    initial, reference, model = make(), make(), make()
    want_loss, want_gradients = users_step(reference, sgd_plain(reference), batch, loss_fn)

    optimizer = sgd_plain(model)
    gradients = stepped_gradients(optimizer)
    step = MicroBatchStep(
        model,
        optimizer,
        loss_fn=loss_fn,
        micro_batch_size=micro_batch_size,
        options=MicroBatchOptions(reduction=reduction),
    )
    loss = step(batch)

    assert step.reduction.reduction == honoured
    torch.testing.assert_close(loss, want_loss, rtol=1e-10, atol=0.0)
    assert_same_step(model, reference, initial, gradients[0], want_gradients)


def test_a_token_mean_with_compute_loss_counts_the_labels_of_a_mapping() -> None:
    """A dict batch with "labels", as Hugging Face collators give: compute_loss's token mean over 5+5+2
    sequences is the user's over 12."""
    inputs, labels = make_token_batch(12)

    def compute_loss(model: nn.Module, micro_batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return cross_entropy(model(micro_batch["inputs"]), micro_batch["labels"])

    initial, reference, model = make_token_model(), make_token_model(), make_token_model()
    want_loss, want_gradients = users_step(reference, sgd_plain(reference), (inputs, labels), cross_entropy)
    optimizer = sgd_plain(model)
    gradients = stepped_gradients(optimizer)
    step = MicroBatchStep(
        model,
        optimizer,
        compute_loss=compute_loss,
        micro_batch_size=5,
        options=MicroBatchOptions(reduction="token_mean"),
    )
    loss = step({"inputs": inputs, "labels": labels})
    torch.testing.assert_close(loss, want_loss, rtol=1e-10, atol=0.0)
    assert_same_step(model, reference, initial, gradients[0], want_gradients)


def ignoring_some(batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch with a third of its first 120 targets ignored: micro-batches count unevenly."""
    targets = batch[1].clone()
    targets[:120:3] = -100
    return batch[0], targets


@functools.cache
def halving_cap(halvings: int) -> int:
    """A cap under which micro-batch 64 of 200 samples runs out of memory ``halvings`` times."""
    batch = make_batch(200)
    fits = 64 >> halvings
    below, above = step_peak_bytes(batch, fits, sgd_plain), step_peak_bytes(batch, 2 * fits, sgd_plain)
    assert below < above, f"no cap between {below} and {above} bytes: the model does not suit the test"
    return (below + above) // 2


@pytest.mark.parametrize("halvings", [1, 2])
@pytest.mark.parametrize(
    ("loss_fn", "ignored"),
    [
        (cross_entropy, False),
        (nn.CrossEntropyLoss(reduction="sum"), False),
        (nn.CrossEntropyLoss(), True),
    ],
    ids=["mean", "sum", "token_mean"],
)
def test_after_real_out_of_memory_halvings_the_step_is_the_users(
    loss_fn: LossFn, ignored: bool, halvings: int
) -> None:
    """Under a real cap_memory micro-batch 64 runs out of memory and halves (once, or twice to 16)
    before the batch fits; the one step taken is the user's."""
    batch = ignoring_some(make_batch(200)) if ignored else make_batch(200)
    initial, reference, model = make_model(), make_model(), make_model()
    want_loss, want_gradients = users_step(reference, sgd_plain(reference), batch, loss_fn)

    optimizer = sgd_plain(model)
    gradients = stepped_gradients(optimizer)
    step = MicroBatchStep(model, optimizer, loss_fn=loss_fn, micro_batch_size=64)
    with batchfit.cap_memory(halving_cap(halvings), resident=[model, optimizer]):
        loss = step(batch)

    sizes = [(change.old_micro_batch_size, change.new_micro_batch_size) for change in step.history]
    assert sizes == [(64, 32), (32, 16)][:halvings]
    assert step.micro_batch_size == 64 >> halvings and len(gradients) == 1
    torch.testing.assert_close(loss, want_loss, rtol=1e-10, atol=0.0)
    assert_same_step(model, reference, initial, gradients[0], want_gradients)


def test_a_non_finite_loss_raises_naming_the_step_and_micro_batch() -> None:
    """A NaN in sample 40 of 64: micro-batch 3 of 4; nothing stepped, the gradients dropped."""
    inputs, targets = make_batch(64)
    inputs[40, 3] = math.nan
    model = make_model()
    optimizer = sgd_plain(model)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    step = MicroBatchStep(model, optimizer, loss_fn=cross_entropy, micro_batch_size=16, scheduler=scheduler)
    message = (
        "MicroBatchStep, optimizer step 0 (micro_batch_size 16): the loss of micro-batch 3 of 4 (samples 32 "
        "to 47 of 64) is nan; the optimizer did not step and the batch's gradients were dropped. Pass "
        f"non_finite='skip' to skip such a step as a GradScaler does. {WHAT_TO_CHECK}"
    )
    with pytest.raises(NonFiniteError, match=f"^{re.escape(message)}$") as raised:
        step((inputs, targets))
    assert isinstance(raised.value, FloatingPointError)
    assert_untouched(model, optimizer, scheduler, step)


def test_a_non_finite_gradient_under_finite_losses_raises_naming_the_parameters() -> None:
    """sqrt at 0 in the loss: every loss is finite, the first layer's weight gradient is NaN."""

    def compute_loss(model: nn.Module, micro_batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        inputs, targets = micro_batch
        return cross_entropy(model(inputs), targets) + torch.sqrt(model[0].weight.sum() * 0.0)

    model = make_model()
    optimizer = sgd_plain(model)
    step = MicroBatchStep(model, optimizer, compute_loss=compute_loss, micro_batch_size=8)
    message = (
        "MicroBatchStep, optimizer step 0 (micro_batch_size 8): the gradients of '0.weight' are not finite "
        "(NaN or inf) after the step's 2 micro-batches, whose losses are finite; the optimizer did not step "
        "and the batch's gradients were dropped. Pass non_finite='skip' to skip such a step as a GradScaler "
        f"does. {WHAT_TO_CHECK}"
    )
    with pytest.raises(NonFiniteError, match=f"^{re.escape(message)}$"):
        step(make_batch(16))
    assert_untouched(model, optimizer, None, step)


def assert_untouched(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LambdaLR | None,
    step: MicroBatchStep,
) -> None:
    for param, init in zip(model.parameters(), make_model().parameters(), strict=True):
        assert torch.equal(param, init) and param.grad is None
    assert len(optimizer.state) == 0 and step.optimizer_steps == 0
    assert scheduler is None or scheduler.last_epoch == 0


def test_skip_drops_the_step_as_a_grad_scaler_would_and_the_next_is_the_users(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """non_finite='skip': the NaN batch steps nothing and is logged and counted; the next batch's step
    is the user's first step on it."""
    bad_inputs, bad_targets = make_batch(32, seed=1)
    bad_inputs[5] = math.inf
    good = make_batch(32, seed=2)
    initial, reference, model = make_model(), make_model(), make_model()
    want_loss, want_gradients = users_step(reference, sgd_plain(reference), good, cross_entropy)

    optimizer = sgd_plain(model)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    gradients = stepped_gradients(optimizer)
    step = MicroBatchStep(
        model,
        optimizer,
        loss_fn=cross_entropy,
        micro_batch_size=8,
        scheduler=scheduler,
        options=MicroBatchOptions(non_finite="skip"),
    )
    with caplog.at_level(logging.WARNING, logger="batchfit"):
        skipped = step((bad_inputs, bad_targets))
    assert math.isnan(skipped) and step.skipped_steps == 1
    assert caplog.messages == [
        (
            "MicroBatchStep: skipped optimizer step 0: the loss of micro-batch 1 of 4 (samples 0 to 7 of 32) "
            "is nan; the gradients were dropped, and the optimizer and scheduler did not step (1 skipped so "
            "far)."
        )
    ]
    assert_untouched(model, optimizer, scheduler, step)

    loss = step(good)
    assert (step.optimizer_steps, step.skipped_steps, scheduler.last_epoch, len(gradients)) == (1, 1, 1, 1)
    torch.testing.assert_close(loss, want_loss, rtol=1e-10, atol=0.0)
    assert_same_step(model, reference, initial, gradients[0], want_gradients)


def test_an_enabled_grad_scaler_stays_in_charge_of_inf() -> None:
    """With a GradScaler the NaN batch is the scaler's to skip: no error, its scale backs off as in the
    user's loop, the weights stay."""
    inputs, targets = make_batch(32)
    inputs[20] = math.nan
    model = make_model()
    optimizer = sgd_plain(model)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8)
    step = MicroBatchStep(model, optimizer, loss_fn=cross_entropy, micro_batch_size=8, scaler=scaler)
    loss = step((inputs, targets))
    assert math.isnan(loss) and scaler.get_scale() == 2.0**7
    assert (step.optimizer_steps, step.skipped_steps) == (1, 0)
    for param, init in zip(model.parameters(), make_model().parameters(), strict=True):
        assert torch.equal(param, init)

    disabled = torch.amp.GradScaler("cpu", enabled=False)  # skips nothing: MicroBatchStep checks
    step = MicroBatchStep(model, optimizer, loss_fn=cross_entropy, micro_batch_size=8, scaler=disabled)
    with pytest.raises(
        NonFiniteError,
        match=r"^MicroBatchStep, optimizer step 0 \(micro_batch_size 8\): the "
        r"loss of micro-batch 3 of 4 \(samples 16 to 23 of 32\) is nan; ",
    ):
        step((inputs, targets))


@pytest.mark.parametrize(
    ("optimizer_class", "factor"), [(torch.optim.SGD, 2.0), (torch.optim.AdamW, math.sqrt(2))]
)
def test_the_schedules_growth_is_the_users_step_at_the_grown_batch_and_rate(
    optimizer_class: type[torch.optim.Optimizer], factor: float
) -> None:
    """The first step after BatchSchedule doubles the accumulation (16 -> 32 samples, micro-batch 8)
    is the user's own step on the 32 samples with the learning rate times the rule's factor."""
    model = make_model()
    optimizer = optimizer_class(model.parameters(), lr=0.01)
    monitor = NoiseScaleMonitor(every=8, schedule=BatchSchedule(min_steps=8, margin=0.01))
    step = MicroBatchStep(
        model,
        optimizer,
        loss_fn=cross_entropy,
        micro_batch_size=8,
        options=MicroBatchOptions(noise_monitor=monitor),
    )
    index = 0
    while not monitor.changes:
        step(make_batch(16, seed=index))
        index += 1
    assert (step.batch_size, monitor.changes[0].new_accumulation_steps) == (32, 4)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.01 * factor, rel=1e-15)

    reference, initial = make_model(), make_model()
    reference.load_state_dict(model.state_dict())
    initial.load_state_dict(model.state_dict())
    ref_optimizer = optimizer_class(reference.parameters(), lr=0.01)
    ref_optimizer.load_state_dict(copy.deepcopy(optimizer.state_dict()))  # its own moments
    for group in ref_optimizer.param_groups:
        group["lr"] = 0.01 * factor  # the user's loop, at the scaled learning rate
    grown = make_batch(32, seed=index)
    want_loss, want_gradients = users_step(reference, ref_optimizer, grown, cross_entropy)

    gradients = stepped_gradients(optimizer)
    loss = step(grown)
    torch.testing.assert_close(loss, want_loss, rtol=1e-10, atol=0.0)
    assert_same_step(model, reference, initial, gradients[0], want_gradients)


def test_the_noise_scale_reads_no_step_whose_token_counts_differ() -> None:
    """A token mean weights micro-batches by their tokens; a reading would weight them alike, so a
    step whose micro-batches count differently gives none."""
    model = make_token_model()
    monitor = NoiseScaleMonitor(every=1)
    step = MicroBatchStep(
        model,
        sgd_plain(model),
        loss_fn=nn.CrossEntropyLoss(),
        micro_batch_size=4,
        options=MicroBatchOptions(noise_monitor=monitor),
    )
    step(make_token_batch(8, seed=1))  # 12 tokens, then 8
    assert monitor.latest is None
    full = make_token_batch(8, seed=2)
    step((full[0], full[1].clamp(min=0)))  # no padding: the same tokens in each micro-batch
    assert monitor.latest is not None

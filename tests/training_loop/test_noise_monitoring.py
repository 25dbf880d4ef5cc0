"""MicroBatchStep's noise-scale monitor on a real tiny model: its estimate is the offline estimate of
readings computed by brute force (each micro-batch's gradient on its own), and the schedule grows
the batch and scales the learning rate exactly as the policy says, the micro-batch unchanged."""

from __future__ import annotations

import logging
import math

import pytest
import torch
from micro_batch_helpers import make_model
from torch import nn

from batchfit import Goal, MicroBatchOptions, MicroBatchStep, NoiseScale
from batchfit.advice.advise import Checklist
from batchfit.policy.noise.goodput import ThroughputAt, goodput
from batchfit.policy.noise.noise_scale import GradientReading, estimate
from batchfit.policy.plan.batch_schedule import BatchSchedule
from batchfit.policy.plan.noise_monitor import NoiseScaleMonitor

cross_entropy = nn.functional.cross_entropy


def make_batch(samples: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and the classes a fixed linear teacher gives them, a tenth of them relabelled at
    random: a gradient with a signal to find, and noise."""
    generator = torch.Generator().manual_seed(seed)
    teacher = torch.randn(16, 4, generator=torch.Generator().manual_seed(99), dtype=torch.float64)
    inputs = torch.randn(samples, 16, generator=generator, dtype=torch.float64)
    targets = (inputs @ teacher).argmax(dim=1)
    noisy = torch.rand(samples, generator=generator) < 0.1
    return inputs, torch.where(noisy, torch.randint(0, 4, (samples,), generator=generator), targets)


def brute_force_reading(
    model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor], micro: int
) -> GradientReading:
    """Each micro-batch's mean-loss gradient by autograd on its own; small is the mean of their
    squared norms, big the squared norm of their mean."""
    inputs, targets = batch
    grads = []
    for start in range(0, len(targets), micro):
        loss = cross_entropy(model(inputs[start : start + micro]), targets[start : start + micro])
        grads.append(
            torch.cat([grad.flatten() for grad in torch.autograd.grad(loss, list(model.parameters()))])
        )
    small = sum(float(grad.square().sum()) for grad in grads) / len(grads)
    big = float(torch.stack(grads).mean(dim=0).square().sum())
    return GradientReading(micro, micro * len(grads), small, big)


def test_the_monitor_logs_every_n_steps_the_offline_estimate_of_the_same_readings(
    caplog: pytest.LogCaptureFixture,
) -> None:
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    monitor = NoiseScaleMonitor(every=4)
    step = MicroBatchStep(
        model,
        optimizer,
        loss_fn=cross_entropy,
        micro_batch_size=8,
        options=MicroBatchOptions(noise_monitor=monitor),
    )
    truth = []
    with caplog.at_level(logging.INFO, logger="batchfit.training_loop.micro_batch_step"):
        for index in range(8):
            batch = make_batch(32, seed=index)
            truth.append(brute_force_reading(model, batch, 8))
            step(batch)
    expected = estimate(truth[4:])
    latest = monitor.latest
    assert latest is not None and latest.optimizer_step == 7
    for field in ("b_simple", "low", "high", "gradient_norm_sq", "trace_sigma"):
        assert getattr(latest.noise_scale, field) == pytest.approx(getattr(expected, field), rel=1e-9), field
    assert (
        latest.noise_scale.steps,
        latest.noise_scale.small_batch_size,
        latest.noise_scale.big_batch_size,
    ) == (
        4,
        8,
        32,
    )
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 2 and lines[1] == f"MicroBatchStep: {latest.line()}."
    assert lines[1].startswith(f"MicroBatchStep: B_simple {expected.b_simple:.4g}, 90% {expected.low:.4g}-")


@pytest.mark.parametrize(
    ("optimizer_class", "factor"), [(torch.optim.SGD, 2.0), (torch.optim.AdamW, math.sqrt(2))]
)
def test_the_schedule_grows_the_batch_and_scales_the_rate_as_the_policy_says(
    optimizer_class: type[torch.optim.Optimizer], factor: float, caplog: pytest.LogCaptureFixture
) -> None:
    model = make_model()
    optimizer = optimizer_class(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    schedule = BatchSchedule(min_steps=8, margin=0.05, max_global_batch_size=64)
    monitor = NoiseScaleMonitor(every=8, schedule=schedule)
    step = MicroBatchStep(
        model,
        optimizer,
        loss_fn=cross_entropy,
        micro_batch_size=8,
        scheduler=scheduler,
        options=MicroBatchOptions(noise_monitor=monitor),
    )
    forwards: list[int] = []
    model.register_forward_hook(lambda module, inputs, output: forwards.append(len(inputs[0])))
    with caplog.at_level(logging.WARNING, logger="batchfit.training_loop.micro_batch_step"):
        for index in range(24):
            step(make_batch(step.batch_size or 16, seed=index))
    # 16 = 2 x 8 grows to 32 after step 7, to 64 (the cap) after step 15, and no further.
    changes = monitor.changes
    assert [(change.optimizer_step, change.new_global_batch_size) for change in changes] == [
        (8, 32),
        (16, 64),
    ]
    assert all(
        change.evidence.low is not None and change.evidence.low >= 0.05 * change.new_global_batch_size
        for change in changes
    )
    assert all(change.learning_rate_factor == pytest.approx(factor) for change in changes)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.01 * factor**2)
    assert scheduler.base_lrs == [pytest.approx(0.01 * factor**2)]
    assert step.batch_size == 64 and step.micro_batch_size == 8
    assert set(forwards) == {8} and len(forwards) == 8 * 2 + 8 * 4 + 8 * 8  # the micro-batch never grew
    messages = [record.getMessage() for record in caplog.records]
    assert len(messages) == 2
    for message, change, size in zip(messages, changes, (32, 64), strict=True):
        assert message.startswith("MicroBatchStep: B_simple ")
        assert message.endswith(
            f"; {change.summary()}; feed batches of {size} samples per device from now on."
        )


def test_a_batch_of_one_micro_batch_reads_nothing_and_says_what_to_do(
    caplog: pytest.LogCaptureFixture,
) -> None:
    model = make_model()
    monitor = NoiseScaleMonitor(every=1)
    step = MicroBatchStep(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        loss_fn=cross_entropy,
        micro_batch_size=32,
        options=MicroBatchOptions(noise_monitor=monitor),
    )
    with caplog.at_level(logging.WARNING):
        step(make_batch(32))
        step(make_batch(32, seed=1))
    assert monitor.latest is None
    assert [record.getMessage() for record in caplog.records] == [
        (
            "MicroBatchStep reads no noise scale from a batch of 32 samples: it runs as one micro-batch, "
            "and the noise scale compares a micro-batch with the batch of two or more; pass a "
            "micro_batch_size of at most half the batch (16)."
        )
    ]


def test_the_noise_scale_micro_batch_step_measured_goes_into_goal_and_checklist_as_it_is() -> None:
    """One NoiseScale type: what the step measured is what Goal and Checklist take, its interval
    carried into goodput, and a number of samples stays the documented shorthand."""
    model = make_model()
    monitor = NoiseScaleMonitor(every=4)
    step = MicroBatchStep(
        model,
        torch.optim.SGD(model.parameters(), lr=0.05),
        cross_entropy,
        micro_batch_size=8,
        options=MicroBatchOptions(noise_monitor=monitor),
    )
    assert step.noise_scale is None
    truth = []
    for index in range(8):
        batch = make_batch(32, seed=index)
        truth.append(brute_force_reading(model, batch, 8))
        step(batch)
    measured = step.noise_scale
    assert isinstance(measured, NoiseScale) and measured is monitor.noise_scale
    assert measured.b_simple == pytest.approx(estimate(truth[4:]).b_simple, rel=1e-9)
    goal = Goal(noise_scale=measured)
    assert goal.noise_scale is measured and Checklist(noise_scale=measured).noise_scale is measured
    points = [ThroughputAt(8, 800.0), ThroughputAt(16, 1400.0), ThroughputAt(32, 2000.0)]
    analysis = goodput(points, goal.noise_scale)
    assert analysis.measured and (analysis.noise_scale_low, analysis.noise_scale_high) == (
        measured.low,
        measured.high,
    )
    shorthand = goodput(points, Goal(noise_scale=measured.b_simple).noise_scale)
    assert not shorthand.measured and shorthand.noise_scale_low is None
    assert [row.batch_size for row in shorthand.rows] == [row.batch_size for row in analysis.rows]

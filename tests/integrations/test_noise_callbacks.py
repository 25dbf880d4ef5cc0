"""The noise-scale callbacks in real training: Lightning's ``Trainer.fit`` and the Hugging Face
``Trainer`` on tiny models on the CPU log B_simple every N optimizer steps, and the schedule grows
the accumulation and scales the learning rate as the policy says, the loader's batch unchanged."""

from __future__ import annotations

import logging
import math

import pytest
import torch
from torch.utils.data import TensorDataset

from batchfit import Goal
from batchfit.errors import ConfigurationError
from batchfit.policy.plan.batch_schedule import BatchSchedule
from batchfit.policy.plan.noise_monitor import NoiseScaleMonitor

pl = pytest.importorskip("lightning.pytorch")
from lightning_tiny import SAMPLES, Classifier, trainer  # noqa: E402

from batchfit.integrations.lightning import NoiseScaleCallback  # noqa: E402


def taught_classifier(batch_size: int) -> Classifier:
    """The tiny classifier on a fixed linear teacher's classes: a gradient signal to measure."""
    module = Classifier(batch_size=batch_size)
    features = module.data.tensors[0]
    teacher = torch.randn(32, 10, generator=torch.Generator().manual_seed(1))
    module.data = TensorDataset(features, (features @ teacher).argmax(dim=1))
    return module


def test_lightning_logs_b_simple_every_n_steps_and_the_schedule_grows_accumulation(
    caplog: pytest.LogCaptureFixture,
) -> None:
    monitor = NoiseScaleMonitor(
        every=4, schedule=BatchSchedule(min_steps=4, margin=1e-3, max_accumulation_steps=4)
    )
    callback = NoiseScaleCallback(monitor)
    module = taught_classifier(batch_size=16)
    batches: list[int] = []
    module.net.register_forward_hook(lambda net, inputs, output: batches.append(len(inputs[0])))
    fit = trainer([callback], accumulate_grad_batches=2, max_steps=12)
    with caplog.at_level(logging.INFO, logger="batchfit.integrations.lightning_noise"):
        fit.fit(module)
    lines = [record.getMessage() for record in caplog.records if record.name.startswith("batchfit")]
    assert len(lines) == 3 and all(line.startswith("B_simple ") for line in lines)
    (change,) = monitor.changes
    assert (change.optimizer_step, change.old_accumulation_steps, change.new_accumulation_steps) == (8, 2, 4)
    assert change.learning_rate_factor == pytest.approx(math.sqrt(2))  # AdamW: the sqrt rule
    assert fit.accumulate_grad_batches == 4
    assert fit.optimizers[0].param_groups[0]["initial_lr"] == pytest.approx(1e-3 * math.sqrt(2))
    assert set(batches) == {16} and len(batches) == 8 * 2 + 4 * 4  # the micro-batch never grew
    latest = monitor.latest
    assert latest is not None and latest.optimizer_step == 11
    assert latest.noise_scale.big_batch_size == 64 and latest.noise_scale.resolved
    assert float(fit.callback_metrics["noise_scale/b_simple"]) == pytest.approx(latest.noise_scale.b_simple)
    assert callback.noise_scale is latest.noise_scale  # a NoiseScale, what Goal takes as it is
    assert Goal(noise_scale=callback.noise_scale).noise_scale is latest.noise_scale


def test_lightning_refuses_a_single_micro_batch_and_says_what_to_do() -> None:
    fit = trainer([NoiseScaleCallback(NoiseScaleMonitor(every=2))], max_steps=2)
    with pytest.raises(ConfigurationError) as raised:
        fit.fit(taught_classifier(batch_size=16))
    assert str(raised.value) == (
        "NoiseScaleCallback needs accumulate_grad_batches >= 2, got 1: the noise scale compares a "
        "micro-batch's gradient with the accumulated batch's, and one micro-batch has nothing to compare "
        "with. Halve the loader's batch_size and set accumulate_grad_batches=2 (the same global batch)."
    )
    assert SAMPLES >= 16 * 4 * 12

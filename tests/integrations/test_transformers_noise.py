"""The noise-scale monitor in the Hugging Face Trainer, on the real Trainer with a tiny GPT-2 on the
CPU: what it logs is the estimate of each step's micro-batches read apart at the step's weights
(before the Trainer clips), and the schedule grows the accumulation where the epoch allows, with the
learning rate, the micro-batch unchanged."""

from __future__ import annotations

import copy
import logging
import math
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("transformers")

from hf_models import VOCAB, gpt2, language_modelling, token_examples
from transformers import TrainerCallback, TrainingArguments

from batchfit import BatchSizes, Goal
from batchfit.errors import ConfigurationError
from batchfit.integrations.transformers import BatchfitTrainer, NoiseScaleMixin, NoiseScaleTrainer
from batchfit.policy.noise.noise_scale import GradientReading, estimate
from batchfit.policy.plan.batch_schedule import BatchSchedule
from batchfit.policy.plan.noise_monitor import NoiseScaleMonitor


class Steps(TrainerCallback):  # type: ignore[misc]
    """Each optimizer step's weights as it starts and its number of micro-batches."""

    def __init__(self) -> None:
        self.weights: list[dict[str, torch.Tensor]] = []
        self.micro_batches: list[int] = []

    def on_step_begin(self, args: Any, state: Any, control: Any, model: Any, **kwargs: Any) -> None:
        self.weights.append(copy.deepcopy(model.state_dict()))
        self.micro_batches.append(1)

    def on_substep_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.micro_batches[-1] += 1


def trainer(
    tmp_path: Path, monitor: NoiseScaleMonitor, examples: list[dict[str, Any]], **changes: Any
) -> NoiseScaleTrainer:
    """The Trainer on the CPU, reading the examples in order, 4 per micro-batch."""
    args = TrainingArguments(
        **{
            "output_dir": str(tmp_path / "run"),
            "use_cpu": True,
            "report_to": [],
            "disable_tqdm": True,
            "save_strategy": "no",
            "logging_strategy": "no",
            "train_sampling_strategy": "sequential",
            "per_device_train_batch_size": 4,
            "learning_rate": 1e-3,
            "lr_scheduler_type": "constant",
            **changes,
        }
    )
    return NoiseScaleTrainer(
        model=gpt2(),
        args=args,
        train_dataset=examples,
        data_collator=language_modelling,
        noise_monitor=monitor,
    )


def skewed(count: int) -> list[dict[str, Any]]:
    """``count`` examples of random tokens, about half of each replaced by token 7."""
    generator = torch.Generator().manual_seed(0)
    examples = []
    for _ in range(count):
        ids = torch.randint(0, VOCAB, (32,), generator=generator)
        ids[torch.rand(32, generator=generator) < 0.5] = 7
        examples.append({"input_ids": ids.tolist(), "label": 0})
    return examples


def truth(weights: dict[str, torch.Tensor], examples: list[dict[str, Any]], micro: int) -> GradientReading:
    """The step's reading by brute force: each micro-batch's gradient of its mean loss, apart."""
    model = gpt2()
    model.load_state_dict(weights)
    grads = []
    for start in range(0, len(examples), micro):
        loss = model(**language_modelling(examples[start : start + micro])).loss
        grads.append(
            torch.cat([grad.flatten() for grad in torch.autograd.grad(loss, list(model.parameters()))])
        )
    small = sum(float(grad.double().square().sum()) for grad in grads) / len(grads)
    big = float(torch.stack(grads).double().mean(dim=0).square().sum())
    return GradientReading(micro, micro * len(grads), small, big)


def test_the_logged_noise_scale_is_the_estimate_of_each_steps_micro_batches_read_apart(
    tmp_path: Path,
) -> None:
    monitor = NoiseScaleMonitor(every=3)
    run = trainer(
        tmp_path, monitor, token_examples(96), gradient_accumulation_steps=4, max_steps=6, max_grad_norm=0.1
    )
    steps = Steps()
    run.add_callback(steps)
    run.train()
    examples = token_examples(96)
    readings = [truth(steps.weights[step], examples[16 * step : 16 * (step + 1)], 4) for step in range(6)]
    logged = [entry for entry in run.state.log_history if "noise_scale/b_simple" in entry]
    assert [entry["step"] for entry in logged] == [3, 6]
    for entry, window in zip(logged, (readings[:3], readings[3:]), strict=True):
        expected = estimate(window)
        assert expected.low is not None and expected.high is not None
        assert entry["noise_scale/b_simple"] == pytest.approx(expected.b_simple, rel=1e-4)
        assert entry["noise_scale/low"] == pytest.approx(expected.low, rel=1e-4)
        assert entry["noise_scale/high"] == pytest.approx(expected.high, rel=1e-4)
    # The reads come before clipping: the gradients are larger than the clipping norm.
    assert all(math.sqrt(reading.big_norm_sq) > 0.1 for reading in readings)
    assert steps.micro_batches == [4] * 6
    # What the Trainer measured is a NoiseScale that Goal takes as it is.
    assert run.noise_scale is not None and run.noise_scale is monitor.noise_scale
    assert run.noise_scale.b_simple == pytest.approx(logged[-1]["noise_scale/b_simple"], rel=1e-4)
    assert Goal(noise_scale=run.noise_scale).noise_scale is run.noise_scale


def test_the_schedule_grows_the_accumulation_where_the_epoch_allows_and_scales_the_rate(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The same 8 examples every step, half their tokens one token: the micro-batches' gradients
    # agree on a direction, so B_simple's interval is narrow (about 0.30-0.36), above the margin's
    # 0.001 x the grown batch of 16, and the batch grows at the first report (3 steps in).
    schedule = BatchSchedule(max_accumulation_steps=4, min_steps=3, margin=1e-3)
    monitor = NoiseScaleMonitor(every=3, schedule=schedule)
    run = trainer(tmp_path, monitor, skewed(8) * 12, gradient_accumulation_steps=2, max_steps=8)
    steps = Steps()
    run.add_callback(steps)
    with caplog.at_level(logging.INFO, logger="batchfit.integrations.transformers.noise_scale"):
        run.train()
    (change,) = monitor.changes
    assert (change.optimizer_step, change.old_accumulation_steps, change.new_accumulation_steps) == (3, 2, 4)
    assert change.learning_rate_factor == pytest.approx(math.sqrt(2))  # AdamW's rule
    # Decided after 3 steps (6 batches, not a multiple of 4), applied after the 4th (8 batches).
    assert steps.micro_batches == [2, 2, 2, 2, 4, 4, 4, 4]
    assert run.args.gradient_accumulation_steps == 4
    assert run.args.per_device_train_batch_size == 4  # the micro-batch, and so memory, unchanged
    assert [group["lr"] for group in run.optimizer.param_groups] == pytest.approx([1e-3 * math.sqrt(2)] * 2)
    assert run.lr_scheduler.base_lrs == pytest.approx([1e-3 * math.sqrt(2)] * 2)
    warnings = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert change.summary() in warnings[0]
    assert "gradient_accumulation_steps 2 -> 4, learning rate x 1.414 from optimizer step 4" in caplog.text
    # The readings after the change are of the larger batch: micro-batch 4, 4 of them.
    assert monitor.readings[-1].small_batch_size == 4 and monitor.readings[-1].big_batch_size == 16


def test_a_change_the_epoch_does_not_allow_waits_for_the_next_epoch(tmp_path: Path) -> None:
    # 6 batches an epoch: decided after 3 steps of 2 (6 batches, not a multiple of 4), at the end.
    schedule = BatchSchedule(max_accumulation_steps=4, min_steps=3, margin=1e-3)
    monitor = NoiseScaleMonitor(every=3, schedule=schedule)
    run = trainer(tmp_path, monitor, skewed(8) * 3, gradient_accumulation_steps=2, num_train_epochs=2)
    steps = Steps()
    run.add_callback(steps)
    run.train()
    assert len(monitor.changes) == 1
    # The second epoch at 4 batches a step, its last step the 2 left (no reading: not 4 of them).
    assert steps.micro_batches == [2, 2, 2, 4, 2]
    assert len(monitor.readings) == 1 and monitor.readings[0].big_batch_size == 16
    # The Trainer counted 6 steps (2 epochs of 3) when it started; the run took 5.
    assert (run.state.global_step, run.state.max_steps) == (5, 6)


def test_one_micro_batch_per_step_is_refused_with_the_split_that_keeps_the_batch(tmp_path: Path) -> None:
    run = trainer(
        tmp_path, NoiseScaleMonitor(every=3), token_examples(32), gradient_accumulation_steps=1, max_steps=2
    )
    with pytest.raises(ConfigurationError) as raised:
        run.train()
    assert str(raised.value) == (
        "NoiseScaleMixin needs gradient_accumulation_steps >= 2, got 1: the noise scale compares a "
        "micro-batch's gradient with the accumulated batch's, and one micro-batch has nothing to compare "
        "with. Set per_device_train_batch_size=2 and gradient_accumulation_steps=2 (the same global batch)."
    )


def test_the_monitor_must_be_a_monitor(tmp_path: Path) -> None:
    with pytest.raises(
        ConfigurationError,
        match=r"noise_monitor must be a batchfit\.policy\.plan\.noise_monitor\.NoiseScaleMonitor, got int\.",
    ):
        trainer(tmp_path, 100, token_examples(32))  # type: ignore[arg-type]


class FittedNoiseScaleTrainer(NoiseScaleMixin, BatchfitTrainer):  # type: ignore[misc]
    """The monitor before the batch-size fitting: it reads the micro-batches the fitting chose."""


def test_before_batchfit_trainer_it_reads_the_fitted_micro_batches(tmp_path: Path) -> None:
    monitor = NoiseScaleMonitor(every=3)
    args = TrainingArguments(
        output_dir=str(tmp_path / "run"),
        use_cpu=True,
        report_to=[],
        disable_tqdm=True,
        save_strategy="no",
        logging_strategy="no",
        train_sampling_strategy="sequential",
        per_device_train_batch_size=16,
        max_steps=6,
    )
    run = FittedNoiseScaleTrainer(
        model=gpt2(),
        args=args,
        train_dataset=token_examples(96),
        data_collator=language_modelling,
        noise_monitor=monitor,
        memory_limit="64MiB",
        sizes=BatchSizes(max_batch_size=8),  # the global batch of 16 as 2 micro-batches of 8
    )
    run.train()
    plan = run.batchfit_plan
    assert plan is not None and (plan.micro_batch_size, plan.accumulation_steps) == (8, 2)
    assert [(reading.small_batch_size, reading.big_batch_size) for reading in monitor.readings] == [
        (8, 16)
    ] * 3
    logged = [entry["step"] for entry in run.state.log_history if "noise_scale/b_simple" in entry]
    assert logged == [3, 6]

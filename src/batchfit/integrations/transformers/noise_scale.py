"""The gradient noise scale in the Hugging Face Trainer: ``NoiseScaleMixin`` reads each optimizer
step's micro-batches against their accumulated gradient, logs ``B_simple`` through the Trainer's
``log`` every N steps, and with a ``BatchSchedule`` grows ``gradient_accumulation_steps`` (the
per-device batch, and so memory, unchanged) and the learning rate."""

from __future__ import annotations

import logging
from typing import Any

import torch
from transformers import Trainer, TrainerCallback

from batchfit.errors import ConfigurationError
from batchfit.policy.noise.noise_scale import GradientReading, NoiseScale
from batchfit.policy.plan.batch_schedule import ScheduleChange
from batchfit.policy.plan.noise_monitor import MonitorUpdate, NoiseScaleMonitor
from batchfit.runtime.steps.gradient_noise import AccumulationNoise
from batchfit.runtime.steps.learning_rate import scale_learning_rate
from batchfit.runtime.steps.micro_batches import count_samples

logger = logging.getLogger(__name__)


class NoiseScaleMixin:
    """Puts the noise-scale monitor in a Trainer class: put it first, ``class MyTrainer(
    NoiseScaleMixin, Trainer)`` (or before ``BatchfitTrainer``), and pass ``noise_monitor=`` a
    ``NoiseScaleMonitor``; the other arguments go to the Trainer. ``trainer.noise_scale`` is the
    monitor's latest ``NoiseScale`` (None before its first report), what ``Goal`` takes.

    Each optimizer step's ``gradient_accumulation_steps`` micro-batches (2 or more: one has no
    smaller batch to compare with) are read after each one's backward, before the Trainer clips or
    unscales (``AccumulationNoise``, one extra copy of the gradients; a GradScaler's scale is divided
    out). Every ``monitor.every`` steps ``noise_scale/b_simple`` (and its interval's
    ``noise_scale/low``, ``noise_scale/high``) go to ``Trainer.log``, so to ``log_history`` and the
    reporters, and the line to this module's logger (process zero). A step with fewer
    micro-batches or one of another size (an epoch's last) gives no reading.

    With the monitor's ``BatchSchedule`` a change sets ``args.gradient_accumulation_steps`` once
    the epoch's batches so far are a multiple of the new accumulation (at once when they are, else
    at the next epoch's start), so no step mixes the two, and multiplies the learning rate of the
    optimizer's groups and the scheduler's ``base_lrs`` by the rule's factor; it is logged
    (WARNING) with its evidence and kept in ``monitor.changes``. One process: DDP, DeepSpeed and
    FSDP reduce the gradients inside the last micro-batch's backward, where a micro-batch's own
    gradient cannot be read, and are refused when training starts.
    """

    args: Any
    state: Any
    model: Any
    optimizer: Any
    lr_scheduler: Any
    accelerator: Any
    add_callback: Any

    def __init__(self, *args: Any, noise_monitor: NoiseScaleMonitor, **kwargs: Any) -> None:
        if not isinstance(noise_monitor, NoiseScaleMonitor):
            raise ConfigurationError(
                "noise_monitor must be a batchfit.policy.plan.noise_monitor.NoiseScaleMonitor, got "
                f"{type(noise_monitor).__name__}."
            )
        self.noise_monitor = noise_monitor
        self._noise_steps = NoiseSteps()
        super().__init__(*args, **kwargs)
        self.add_callback(_NoiseScaleEvents(self))

    @property
    def noise_scale(self) -> NoiseScale | None:
        """The monitor's latest noise scale (None before its first report)."""
        return self.noise_monitor.noise_scale

    def training_step(
        self, model: torch.nn.Module, inputs: Any, num_items_in_batch: Any = None
    ) -> torch.Tensor:
        try:
            samples = count_samples(inputs, 0)  # before the step, which may move or drop inputs
        except ConfigurationError as error:
            error.add_note("NoiseScaleMixin counts a micro-batch's samples along its tensors' dim 0.")
            raise
        loss: torch.Tensor = super().training_step(model, inputs, num_items_in_batch)  # type: ignore[misc]
        steps = self._noise_steps
        steps.batches += 1
        steps.sizes.append(samples)
        if steps.collector is None or steps.collector.micro_batch_size != steps.sizes[0]:
            scaler = getattr(self.accelerator, "scaler", None)
            steps.collector = AccumulationNoise(self.model.parameters(), steps.sizes[0], scaler=scaler)
        steps.collector.after_backward()
        if self.accelerator.sync_gradients:  # the step's last micro-batch: read before clipping
            steps.end_step(int(self.args.gradient_accumulation_steps))
        return loss


class NoiseSteps:
    """What the mixin keeps between the Trainer's calls: the reader, the step's micro-batch sizes,
    its reading, the epoch's batches so far, and a change waiting for a step that starts where
    both accumulations divide the epoch's batches."""

    def __init__(self) -> None:
        self.collector: AccumulationNoise | None = None
        self.sizes: list[int] = []  # this step's micro-batches
        self.reading: GradientReading | None = None  # the last step's, until the step ends
        self.batches = 0  # this epoch's, so far
        self.counted = True  # whether ``batches`` counts from the epoch's start (not a resumed epoch)
        self.pending: ScheduleChange | None = None

    def end_step(self, accumulation_steps: int) -> None:
        """The step's reading, where its micro-batches are ``accumulation_steps`` of one size."""
        sizes, self.sizes = self.sizes, []
        collector = self.collector
        if collector is None or len(sizes) != accumulation_steps or len(set(sizes)) > 1 or len(sizes) < 2:
            self.collector = None  # an uneven step: no reading, and the copy starts afresh
            return
        self.reading = collector.end_step()


class _NoiseScaleEvents(TrainerCallback):  # type: ignore[misc]
    """The Trainer's events the mixin acts on: its checks when training starts, the monitor fed and
    its report logged when a step ends, the schedule's change applied where the epoch allows."""

    def __init__(self, trainer: NoiseScaleMixin) -> None:
        self.trainer = trainer

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        check_trainer(self.trainer)
        steps = self.trainer._noise_steps
        steps.sizes, steps.collector, steps.pending = [], None, None
        steps.batches = 0
        # Resumed inside an epoch, the batches it ran before are not counted: changes wait for its end.
        steps.counted = not (state.epoch or 0) % 1

    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        steps = self.trainer._noise_steps
        if steps.batches:  # an epoch ran, so this one is counted from its start
            steps.counted = True
        steps.batches = 0
        self._apply_pending()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        trainer, steps = self.trainer, self.trainer._noise_steps
        reading, steps.reading = steps.reading, None
        if reading is not None:
            report = trainer.noise_monitor.record(
                reading,
                optimizer_step=state.global_step - 1,
                accumulation_steps=reading.big_batch_size // reading.small_batch_size,
                micro_batch_size=reading.small_batch_size,
                optimizer=type(getattr(trainer.optimizer, "optimizer", trainer.optimizer)).__name__,
            )
            if report is not None:
                self._log(report)
                steps.pending = report.change or steps.pending
        pending = steps.pending
        if steps.counted and pending is not None and steps.batches % pending.new_accumulation_steps == 0:
            self._apply_pending()

    def _apply_pending(self) -> None:
        trainer, steps = self.trainer, self.trainer._noise_steps
        change, steps.pending = steps.pending, None
        if change is None:
            return
        trainer.args.gradient_accumulation_steps = change.new_accumulation_steps
        scheduler = trainer.lr_scheduler
        schedulers = [] if scheduler is None else [getattr(scheduler, "scheduler", scheduler)]
        scale_learning_rate(trainer.optimizer, change.learning_rate_factor, schedulers)
        if trainer.args.process_index == 0:
            logger.info(
                f"gradient_accumulation_steps {change.old_accumulation_steps} -> "
                f"{change.new_accumulation_steps}, learning rate x {change.learning_rate_factor:.4g} from "
                f"optimizer step {trainer.state.global_step}"
            )

    def _log(self, report: MonitorUpdate) -> None:
        noise, values = report.noise_scale, dict[str, float]()
        if noise.resolved:
            values["noise_scale/b_simple"] = noise.b_simple
        if noise.low is not None and noise.high is not None:
            values |= {"noise_scale/low": noise.low, "noise_scale/high": noise.high}
        if values:
            self.trainer.log(values)  # type: ignore[attr-defined]
        if self.trainer.args.process_index == 0:
            logger.log(logging.INFO if report.change is None else logging.WARNING, "%s", report.line())


def check_trainer(trainer: Any) -> None:
    """What the mixin needs of the Trainer when training starts, or an error that says what to change."""
    args = trainer.args
    for flag, name in (("is_deepspeed_enabled", "DeepSpeed"), ("is_fsdp_enabled", "FSDP")):
        if getattr(trainer, flag, False):
            raise ConfigurationError(
                f"NoiseScaleMixin does not read {name} runs: {name} reduces (and shards) the gradients "
                f"inside the backward, where a micro-batch's own gradient cannot be read. Measure the "
                f"noise scale on one device, or offline with batchfit.noise_scale."
            )
    if args.world_size > 1 or args.n_gpu > 1:
        raise ConfigurationError(
            f"NoiseScaleMixin reads one device's micro-batches, and the Trainer runs on "
            f"{max(args.world_size, args.n_gpu)} devices: their gradients are averaged in the last "
            f"micro-batch's backward, where its own gradient cannot be read. Measure the noise scale on "
            f"one device, or offline with batchfit.noise_scale."
        )
    accumulation = int(args.gradient_accumulation_steps)
    if accumulation < 2:
        per_device = int(args.per_device_train_batch_size)
        raise ConfigurationError(
            f"NoiseScaleMixin needs gradient_accumulation_steps >= 2, got {accumulation}: the noise scale "
            f"compares a micro-batch's gradient with the accumulated batch's, and one micro-batch has "
            f"nothing to compare with. Set per_device_train_batch_size={max(per_device // 2, 1)} and "
            f"gradient_accumulation_steps={2 * accumulation} (the same global batch)."
        )


class NoiseScaleTrainer(NoiseScaleMixin, Trainer):  # type: ignore[misc]
    """The Trainer with the noise-scale monitor (``NoiseScaleMixin``)::

    trainer = NoiseScaleTrainer(model=model, args=args, train_dataset=train,
                                noise_monitor=NoiseScaleMonitor(100))
    """

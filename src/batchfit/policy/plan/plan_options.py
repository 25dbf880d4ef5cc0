"""What ``plan`` is told besides the split: the batch the learning rate was tuned at, how the learning
rate, weight decay and warm-up follow the batch, and what the training does. Each option object is
checked once, when it is made; a field is its flag's name with underscores."""

from __future__ import annotations

from dataclasses import MISSING, dataclass
from typing import Literal

from batchfit.checks import check_positive_int, check_positive_number, option
from batchfit.errors import ConfigurationError
from batchfit.policy.noise.goodput import noise_scale_of
from batchfit.policy.noise.noise_scale import NoiseScale

ScalingRule = Literal["linear", "sqrt"]
SCALING_RULES: tuple[str, ...] = ("linear", "sqrt")


@dataclass(frozen=True)
class Baseline:
    """The run the hyperparameters were tuned on: ``Baseline(0.1, 256)`` is a learning rate of 0.1
    tuned at a global batch of 256."""

    base_learning_rate: float = option(MISSING, "the learning rate tuned at --base-batch-size")
    base_batch_size: int = option(MISSING, "the global batch size --base-learning-rate was tuned at")
    weight_decay: float | None = option(None, "the weight decay at --base-batch-size (default: none planned)")

    def __post_init__(self) -> None:
        check_positive_int("base_batch_size", self.base_batch_size)
        check_positive_number("base_learning_rate", self.base_learning_rate)
        if self.weight_decay is not None:
            check_positive_number("weight_decay", self.weight_decay, allow_zero=True)


@dataclass(frozen=True)
class Scaling:
    """How the learning rate, the weight decay and the warm-up follow the global batch."""

    scaling_rule: ScalingRule | None = option(
        None,
        "linear: the learning rate times k = global / base batch; sqrt: times sqrt(k) "
        "(default: sqrt for an Adam-family or RMSprop --optimizer, else linear)",
    )
    optimizer: str | None = option(
        None, "the optimizer's name (sgd, adam, adamw, ...): picks the rule when --scaling-rule is not given"
    )
    scale_weight_decay: bool = option(False, "scale --weight-decay by sqrt(k), whatever the rule")
    warmup_steps: int | None = option(
        None, "optimizer steps of linear warm-up (default: recommended from the learning rate's scale-up)"
    )
    steps_per_epoch: int | None = option(
        None, "optimizer steps per epoch at the global batch: the recommended warm-up lasts 5 epochs at most"
    )

    def __post_init__(self) -> None:
        if self.scaling_rule is not None and self.scaling_rule not in SCALING_RULES:
            raise ConfigurationError(f"scaling_rule must be 'linear' or 'sqrt', got {self.scaling_rule!r}.")
        if self.optimizer is not None and (not isinstance(self.optimizer, str) or not self.optimizer.strip()):
            raise ConfigurationError(
                f"optimizer must be an optimizer's name such as 'sgd' or 'adamw', got {self.optimizer!r}."
            )
        if self.warmup_steps is not None:
            check_positive_int("warmup_steps", self.warmup_steps, minimum=0)
        if self.steps_per_epoch is not None:
            check_positive_int("steps_per_epoch", self.steps_per_epoch)


@dataclass(frozen=True)
class TrainingFacts:
    """What the training does, for the plan's warnings; none of it changes the plan's numbers."""

    uses_batchnorm: bool = option(
        False, "the model uses BatchNorm (a micro-batch under 16: noisy statistics)"
    )
    uses_ema: bool = option(
        False, "the training keeps an EMA of the weights (updated once per optimizer step)"
    )
    fine_tuning: bool = option(False, "fine-tuning a pre-trained model (a large batch or rate overwrites it)")
    noise_scale: float | NoiseScale | None = option(
        None,
        "the gradient noise scale B_noise in samples: how far scaling pays, and a warning far above it",
    )

    def __post_init__(self) -> None:
        if self.noise_scale is not None:
            noise_scale_of(self.noise_scale)

"""Plan a training run at a target global batch: micro-batch, accumulation, scaled learning rate, warm-up.

Pure arithmetic (no torch), so every rule here is testable without a device.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from typing import Any, ClassVar

from batchfit.checks import check_option
from batchfit.errors import ConfigurationError
from batchfit.policy.noise.scaling_payoff import ScalingPayoff, scaling_payoff
from batchfit.policy.plan.learning_rate import (
    WARMUP_MAX_EPOCHS,
    WARMUP_STEPS_PER_LR_SCALE,
    learning_rate_scale,
    recommended_warmup,
    scaled_weight_decay,
    warmup_steps_of,
)
from batchfit.policy.plan.micro_batch import plan_micro_batch
from batchfit.policy.plan.plan_options import Baseline, Scaling, ScalingRule, TrainingFacts
from batchfit.policy.plan.scaling_rules import scaling_rule
from batchfit.result import stamped

# Warning thresholds, from seed 002.
MAX_ACCUMULATION_STEPS = 16  # "Keep accumulation <= 16x"
NO_WARMUP_MAX_LR_SCALE = 4  # 4x: "maybe" needs warm-up; 8x: "yes"; 16x: "critical"
BATCHNORM_MIN_MICRO_BATCH = 16  # "If using BatchNorm with small batch (< 16)"
FINE_TUNING_MAX_GLOBAL_BATCH = 64  # "Fine-tuning requires SMALLER batch size (32-64)"


@dataclass(frozen=True)
class Plan:
    """How to train at ``global_batch_size = micro_batch_size x accumulation_steps x world_size``."""

    micro_batch_size: int
    accumulation_steps: int
    world_size: int
    global_batch_size: int
    scale_factor: float  # global_batch_size / base_batch_size
    learning_rate: float
    base_learning_rate: float
    base_batch_size: int
    scaling_rule: ScalingRule
    warmup_steps: int  # optimizer steps of linear warm-up from 0 to learning_rate
    warmup_recommended: bool  # True: computed by batchfit; False: as given
    weight_decay: float | None
    base_weight_decay: float | None
    warnings: tuple[str, ...]
    optimizer: str | None = None  # as given: it picks the rule when scaling_rule is not given
    scaling_reason: str = ""  # which rule, and why, in one line ("sqrt: Adam-family optimizers ...")
    payoff: ScalingPayoff | None = None  # with a noise scale: the steps and samples against the base's

    @property
    def learning_rate_scale(self) -> float:
        """learning_rate / base_learning_rate: the scale factor under the linear rule, its root under sqrt."""
        return learning_rate_scale(self.scale_factor, self.scaling_rule)

    command: ClassVar[str] = "plan"

    def to_dict(self) -> dict[str, Any]:
        document = dataclasses.asdict(self)
        document["warnings"] = list(self.warnings)
        document["payoff"] = None if self.payoff is None else self.payoff.to_dict()
        return stamped(self.command, document)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def table(self) -> str:
        """The plan as the command prints it: one line per quantity (the split, the learning rate
        and its rule, the warm-up, the payoff, the weight decay), then the warnings."""
        lines = [*self._quantities(), *(f"warning: {warning}" for warning in self.warnings)]
        return "\n".join(lines) + "\n"

    def summary(self) -> str:
        """One paragraph: the split, the learning rate, the warm-up and the weight decay, and how
        many warnings ``table`` gives (the rule's reason and the payoff are the table's)."""
        split, learning_rate, _, warmup, *rest = self._quantities()
        quantities = [split, learning_rate, warmup, *(rest[-1:] if self.weight_decay is not None else [])]
        count = len(self.warnings)
        warned = f"; {count} warning{'s' if count > 1 else ''} (see the table)" if count else ""
        return "; ".join(quantities) + warned + "."

    def _quantities(self) -> list[str]:
        """The split, the learning rate, its rule and why, the warm-up, the payoff, the weight decay."""
        rule = (
            f"{self.global_batch_size} / {self.base_batch_size}"
            if self.scaling_rule == "linear"
            else f"sqrt({self.global_batch_size} / {self.base_batch_size})"
        )
        lines = [
            (
                f"global_batch_size {self.global_batch_size} = micro_batch_size {self.micro_batch_size} "
                f"x accumulation_steps {self.accumulation_steps} x world_size {self.world_size}"
            ),
            (
                f"learning_rate {self.learning_rate:g} = base_learning_rate {self.base_learning_rate:g} "
                f"x {rule} ({self.scaling_rule} rule)"
            ),
            f"scaling_rule {self.scaling_reason}",
            f"warmup_steps {self.warmup_steps} ({self._warmup_reason()})",
        ]
        lines.extend(self._payoff_lines())
        if self.weight_decay is not None:
            scaled = self.weight_decay != self.base_weight_decay
            how = f"= {self.base_weight_decay:g} x sqrt({self.scale_factor:g})" if scaled else "(unchanged)"
            lines.append(f"weight_decay {self.weight_decay:g} {how}")
        return lines

    def _payoff_lines(self) -> list[str]:
        return (
            []
            if self.payoff is None
            else list(self.payoff.lines(self.scaling_rule, self.learning_rate_scale))
        )

    def _warmup_reason(self) -> str:
        if not self.warmup_recommended:
            return "as given"
        if self.warmup_steps == 0:
            return "recommended: the learning rate is not scaled up"
        uncapped = math.ceil(WARMUP_STEPS_PER_LR_SCALE * self.learning_rate_scale)
        scale = self.learning_rate_scale
        reason = f"recommended: {WARMUP_STEPS_PER_LR_SCALE} steps x learning-rate scale-up {scale:g}"
        return reason + (f", capped at {WARMUP_MAX_EPOCHS} epochs" if self.warmup_steps < uncapped else "")


def plan(
    global_batch_size: int,
    baseline: Baseline,
    *,
    world_size: int = 1,
    max_micro_batch_size: int | None = None,
    micro_batch_size: int | None = None,
    scaling: Scaling = Scaling(),
    training: TrainingFacts = TrainingFacts(),
) -> Plan:
    """Split ``global_batch_size`` over ``world_size`` devices and scale the learning rate to it.

    ``plan(1024, Baseline(0.1, 256), world_size=8, max_micro_batch_size=48)`` trains 32 samples x 4
    accumulation steps x 8 devices at a learning rate of 0.4 (the linear rule), warming up 400 steps.

    Args:
        global_batch_size: the samples of one optimizer step, over all devices.
        baseline: the learning rate (and weight decay) tuned at a batch size.
        world_size: the devices the batch is split over.
        max_micro_batch_size: the largest micro-batch that fits a device, as ``find`` measured it.
        micro_batch_size: a micro-batch to use as given (one of the two is needed).
        scaling: the learning-rate rule (or the optimizer that picks it), the weight-decay
            scaling and the warm-up.
        training: what the training does (BatchNorm, EMA, fine-tuning), for ``Plan.warnings``, and
            its gradient noise scale, for ``Plan.payoff`` (how far scaling pays; docs/goodput.md).

    The micro-batch is the largest divisor of the per-device batch up to ``max_micro_batch_size`` (a
    global batch that leaves under half of it is refused, naming ones that work); the learning rate
    scales by ``k = global_batch_size / base_batch_size`` (linear) or ``sqrt(k)``: the rule given, or
    else the optimizer's (sqrt for Adam-family and RMSprop, linear for SGD and when unknown); the
    warm-up, unless given, is 100 optimizer steps per 1x of scale-up, at most 5 epochs. Rules and
    sources: docs/plan.md.
    """
    _check_options(baseline, scaling, training)
    micro = plan_micro_batch(global_batch_size, world_size, max_micro_batch_size, micro_batch_size)
    scale = global_batch_size / baseline.base_batch_size
    rule, reason = scaling_rule(scaling.scaling_rule, scaling.optimizer)
    lr_scale = learning_rate_scale(scale, rule)
    result = Plan(
        micro_batch_size=micro,
        accumulation_steps=global_batch_size // (world_size * micro),
        world_size=world_size,
        global_batch_size=global_batch_size,
        scale_factor=scale,
        learning_rate=baseline.base_learning_rate * lr_scale,
        base_learning_rate=baseline.base_learning_rate,
        base_batch_size=baseline.base_batch_size,
        scaling_rule=rule,
        warmup_steps=warmup_steps_of(scaling, lr_scale),
        warmup_recommended=scaling.warmup_steps is None,
        weight_decay=scaled_weight_decay(baseline.weight_decay, scale, scaling.scale_weight_decay),
        base_weight_decay=baseline.weight_decay,
        warnings=(),
        optimizer=scaling.optimizer,
        scaling_reason=reason,
        payoff=_payoff(global_batch_size, baseline, training),
    )
    return dataclasses.replace(result, warnings=_warnings(result, training, scaling.steps_per_epoch))


def _check_options(baseline: Baseline, scaling: Scaling, training: TrainingFacts) -> None:
    """A ConfigurationError where an options argument has the wrong type, or weight decay is to be
    scaled without a base value."""
    for name, value, kind in (
        ("baseline", baseline, Baseline),
        ("scaling", scaling, Scaling),
        ("training", training, TrainingFacts),
    ):
        check_option("plan", name, value, kind)
    _check_weight_decay(baseline, scaling)


def _check_weight_decay(baseline: Baseline, scaling: Scaling) -> None:
    if scaling.scale_weight_decay and baseline.weight_decay is None:
        raise ConfigurationError("scale_weight_decay needs weight_decay (the value at base_batch_size).")


def _payoff(global_batch_size: int, baseline: Baseline, training: TrainingFacts) -> ScalingPayoff | None:
    """How far scaling pays, where the training's noise scale is known."""
    if training.noise_scale is None:
        return None
    return scaling_payoff(global_batch_size, baseline.base_batch_size, training.noise_scale)


def _warnings(result: Plan, training: TrainingFacts, steps_per_epoch: int | None) -> tuple[str, ...]:
    """Seed 002's warnings that apply to ``result``: over 16 accumulation steps; a 4x or larger
    learning-rate jump with ``warmup_steps=0``; BatchNorm with a micro-batch under 16; EMA with
    accumulation; fine-tuning with a global batch over 64 or a scaled-up learning rate."""
    accumulation, micro, world_size = result.accumulation_steps, result.micro_batch_size, result.world_size
    lr_scale, learning_rate = result.learning_rate_scale, result.learning_rate
    global_batch_size = result.global_batch_size
    recommended, warmup_steps = result.warmup_recommended, result.warmup_steps
    warnings: list[str] = []
    if accumulation > MAX_ACCUMULATION_STEPS:
        warnings.append(
            f"accumulation_steps {accumulation} is above {MAX_ACCUMULATION_STEPS}: every optimizer step runs "
            f"{accumulation} forward and backward passes one after another; keep it at "
            f"{MAX_ACCUMULATION_STEPS} or less with a larger micro-batch (if memory allows), more devices "
            f"or a smaller global_batch_size."
        )
    if not recommended and warmup_steps == 0 and lr_scale >= NO_WARMUP_MAX_LR_SCALE:
        advice = recommended_warmup(lr_scale, steps_per_epoch)
        warnings.append(
            f"learning_rate {learning_rate:g} is {lr_scale:g}x base_learning_rate with warmup_steps 0: "
            f"a jump this large can diverge in the first steps; warm up linearly over about {advice} "
            f"steps (leave warmup_steps unset for this recommendation)."
        )
    if training.uses_batchnorm and micro < BATCHNORM_MIN_MICRO_BATCH:
        fix = (
            f"convert the model with torch.nn.SyncBatchNorm.convert_sync_batchnorm (statistics over "
            f"{micro} x {world_size} = {micro * world_size} samples) or use GroupNorm"
            if world_size > 1
            else "use GroupNorm (SyncBatchNorm only pools across devices, and there is one)"
        )
        warnings.append(
            f"uses_batchnorm with micro_batch_size {micro}: BatchNorm statistics see only the {micro} "
            f"samples of one forward pass, not the global batch, and under {BATCHNORM_MIN_MICRO_BATCH} "
            f"they are noisy; {fix}."
        )
    if training.uses_ema and accumulation > 1:
        warnings.append(
            f"uses_ema with accumulation_steps {accumulation}: update the EMA once per optimizer step "
            f"(right after optimizer.step()), not after each of the {accumulation} backward passes, "
            f"or it decays {accumulation} times per update."
        )
    if training.fine_tuning and (global_batch_size > FINE_TUNING_MAX_GLOBAL_BATCH or lr_scale > 1):
        warnings.append(
            f"fine_tuning with global_batch_size {global_batch_size} and learning_rate {learning_rate:g} "
            f"({lr_scale:g}x base_learning_rate): large batches and large steps overwrite pre-trained "
            f"weights quickly; fine-tune with a global batch of {FINE_TUNING_MAX_GLOBAL_BATCH} or less "
            f"and a learning rate 10-100x below the pre-training one."
        )
    far_above = None if result.payoff is None else result.payoff.warning()
    return tuple([*warnings, far_above] if far_above else warnings)

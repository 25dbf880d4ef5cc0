"""The learning-rate arithmetic of a plan, free of torch: the learning rate's scale by the linear or
square-root rule, the warm-up recommended for a scale-up, and the weight decay scaled with the batch."""

from __future__ import annotations

import math

from batchfit.policy.plan.plan_options import Scaling

# Warm-up: 100 optimizer steps per unit of learning-rate scale-up (seed 002's example: 1000 steps
# for a 10x scale-up), at most 5 epochs (Goyal et al. 2017: 5 epochs for 256 -> 8192, a 32x scale-up).
WARMUP_STEPS_PER_LR_SCALE = 100
WARMUP_MAX_EPOCHS = 5


def learning_rate_scale(scale: float, scaling_rule: str) -> float:
    """What the learning rate is multiplied by for ``scale = global_batch_size / base_batch_size``:
    ``scale`` by the linear rule (Goyal et al. 2017), ``sqrt(scale)`` by the square-root rule
    (Krizhevsky 2014; Malladi et al. 2022 for Adam and RMSprop)."""
    return scale if scaling_rule == "linear" else math.sqrt(scale)


def recommended_warmup(lr_scale: float, steps_per_epoch: int | None) -> int:
    """Optimizer steps of warm-up for a learning-rate scale-up ``lr_scale``: 0 when it is at most 1,
    else ``ceil(100 x lr_scale)`` (seed 002 warms up 1000 steps for a 10x scale-up), at most 5 epochs
    of ``steps_per_epoch`` optimizer steps at the global batch (Goyal et al. warm up over 5 epochs for
    their largest scale-up, 256 -> 8192)."""
    steps = 0 if lr_scale <= 1 else math.ceil(WARMUP_STEPS_PER_LR_SCALE * lr_scale)
    if steps_per_epoch is not None:
        steps = min(steps, WARMUP_MAX_EPOCHS * steps_per_epoch)
    return steps


def scaled_weight_decay(weight_decay: float | None, scale: float, scale_weight_decay: bool) -> float | None:
    """Unchanged, or with ``scale_weight_decay`` multiplied by ``sqrt(scale)`` whatever the
    learning-rate rule: seed 002 ("weight_decay ~ sqrt(batch_size)") and the normalized weight decay
    of Loshchilov & Hutter (2019, AdamW) both grow it with the square root of the batch."""
    if weight_decay is not None and scale_weight_decay:
        return weight_decay * math.sqrt(scale)
    return weight_decay


def warmup_steps_of(scaling: Scaling, lr_scale: float) -> int:
    """The warm-up given, else the one recommended for the learning rate's scale-up."""
    if scaling.warmup_steps is not None:
        return scaling.warmup_steps
    return recommended_warmup(lr_scale, scaling.steps_per_epoch)

"""Which learning-rate scaling rule fits which optimizer, and why, in one line each (docs/plan.md).

SGD's update is the gradient times the learning rate, and k times the batch averages away k times
the gradient noise: the linear rule (Goyal et al., 2017) keeps the update's drift and noise as they
were, after a warm-up. Adam and RMSprop divide the gradient by a running estimate of its scale, so
the noise they pass on shrinks with the square root of the batch; their stochastic differential
equation keeps its shape under the square-root rule (Malladi et al., "On the SDEs and Scaling Rules
for Adaptive Gradient Algorithms", NeurIPS 2022).
"""

from __future__ import annotations

from typing import Literal

from batchfit.policy.plan.plan_options import ScalingRule

Family = Literal["sgd", "adam", "rmsprop"]

_SQRT = "the learning rate with the square root of the batch (Malladi et al., 2022)"
_WHY: dict[Family, tuple[ScalingRule, str]] = {
    "sgd": ("linear", "SGD scales the learning rate with the batch, after a warm-up (Goyal et al., 2017)"),
    "adam": ("sqrt", f"Adam-family optimizers scale {_SQRT}"),
    "rmsprop": ("sqrt", f"RMSprop, like Adam, scales {_SQRT}"),
}


def family(optimizer: str) -> Family | None:
    """The family of an optimizer's name (``"AdamW"``, ``"adam"``, ``"SGD"``, ``"FusedAdam"``,
    ``"AdamW8bit"``...); None for one whose rule is not known here (Adagrad, Lion, LAMB...)."""
    key = "".join(character for character in optimizer.lower() if character.isalnum())
    if "adam" in key:  # Adam, AdamW, Adamax, NAdam, RAdam, SparseAdam and their fused or 8-bit kin
        return "adam"
    if "rmsprop" in key:
        return "rmsprop"
    if key.startswith("sgd"):
        return "sgd"
    return None


def scaling_rule(given: ScalingRule | None, optimizer: str | None) -> tuple[ScalingRule, str]:
    """The rule to apply and why, in one line: ``given`` always wins; else the optimizer family's
    rule; else the linear rule, SGD's, saying what would choose another."""
    known = None if optimizer is None else family(optimizer)
    if given is not None:
        why = f"{given}: as given (scaling_rule)"
        if known is not None and _WHY[known][0] != given:
            rule, reason = _WHY[known]
            why += f"; {optimizer} would take {rule}: {reason}"
        return given, why
    if known is not None:
        rule, reason = _WHY[known]
        return rule, f"{rule}: {reason}"
    linear = "linear: the rule for SGD (Goyal et al., 2017)"
    if optimizer is None:
        return "linear", f"{linear}; the optimizer is not known (give optimizer: Adam-family ones take sqrt)"
    return "linear", f"{linear}; no rule is known for {optimizer} (give scaling_rule to choose one)"

"""When to grow the global batch during training, free of torch: the noise-scale evidence that
doubles the accumulation (the micro-batch, and so memory, unchanged), the caps a plan sets, and the
learning rate scaled by the optimizer's rule (``policy/plan/scaling_rules.py``).

A run well below its critical batch (the noise scale, McCandlish et al. 2018) loses little by a
larger batch and gains fewer steps; the noise scale grows as the loss falls, so a batch that was
right at the start becomes too small. The schedule grows the batch when the interval of the noise
scale measured since the last change lies above the batch it would grow to, and never shrinks it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from batchfit.checks import check_positive_int, check_positive_number
from batchfit.errors import ConfigurationError
from batchfit.policy.noise.noise_scale import NoiseScale
from batchfit.policy.plan.plan import MAX_ACCUMULATION_STEPS
from batchfit.policy.plan.plan_options import SCALING_RULES, ScalingRule
from batchfit.policy.plan.scaling_rules import scaling_rule


@dataclass(frozen=True)
class BatchSchedule:
    """An opt-in schedule that grows the global batch through accumulation as the noise scale grows.

    After at least ``min_steps`` optimizer steps at the current batch, when the 90% interval's lower
    bound of the noise scale is at least ``margin`` x the global batch it would grow to, the
    accumulation doubles (capped by ``max_accumulation_steps`` and ``max_global_batch_size``) and
    the learning rate is multiplied by the rule's factor: 2 (linear, SGD) or sqrt(2) (sqrt,
    Adam-family and RMSprop). It never shrinks.
    """

    max_global_batch_size: int | None = None
    """The largest global batch the plan allows (None: only ``max_accumulation_steps`` caps it)."""
    max_accumulation_steps: int = MAX_ACCUMULATION_STEPS
    """The most micro-batches per device per optimizer step (plan warns above 16)."""
    min_steps: int = 20
    """Optimizer steps at the current batch before it may grow: the evidence the interval rests on."""
    margin: float = 1.0
    """Grow when the noise scale's lower bound is at least margin x the grown global batch."""
    scaling_rule: ScalingRule | None = None
    """linear or sqrt; None: the optimizer's rule (sqrt for Adam-family and RMSprop, else linear)."""

    def __post_init__(self) -> None:
        if self.max_global_batch_size is not None:
            check_positive_int("max_global_batch_size", self.max_global_batch_size)
        check_positive_int("max_accumulation_steps", self.max_accumulation_steps)
        check_positive_int("min_steps", self.min_steps, minimum=3)  # the interval needs 3 steps
        check_positive_number("margin", self.margin)
        if self.scaling_rule is not None and self.scaling_rule not in SCALING_RULES:
            raise ConfigurationError(f"scaling_rule must be 'linear' or 'sqrt', got {self.scaling_rule!r}.")

    def grown_accumulation(
        self, accumulation_steps: int, micro_batch_size: int, world_size: int
    ) -> int | None:
        """The accumulation one growth gives: doubled, within both caps; None where the caps
        allow no more."""
        grown = min(2 * accumulation_steps, self.max_accumulation_steps)
        if self.max_global_batch_size is not None:
            grown = min(grown, self.max_global_batch_size // (micro_batch_size * world_size))
        return grown if grown > accumulation_steps else None

    def decide(
        self,
        evidence: NoiseScale,
        *,
        optimizer_step: int,
        accumulation_steps: int,
        micro_batch_size: int,
        world_size: int = 1,
        optimizer: str | None = None,
    ) -> ScheduleChange | None:
        """The change from optimizer step ``optimizer_step`` on, or None: ``evidence`` is the noise
        scale measured at the current batch since its last change; ``optimizer`` (a class name)
        picks the learning-rate rule unless ``scaling_rule`` is given."""
        if evidence.steps < self.min_steps or evidence.low is None:
            return None
        grown = self.grown_accumulation(accumulation_steps, micro_batch_size, world_size)
        if grown is None:
            return None
        old_global = micro_batch_size * accumulation_steps * world_size
        new_global = micro_batch_size * grown * world_size
        if evidence.low < self.margin * new_global:
            return None
        rule, reason = scaling_rule(self.scaling_rule, optimizer)
        factor = new_global / old_global if rule == "linear" else math.sqrt(new_global / old_global)
        return ScheduleChange(
            optimizer_step, accumulation_steps, grown, old_global, new_global, factor, rule, reason, evidence
        )


@dataclass(frozen=True)
class ScheduleChange:
    """One growth of the global batch, and the evidence for it."""

    optimizer_step: int  # the first optimizer step (0-based) at the new batch
    old_accumulation_steps: int
    new_accumulation_steps: int
    old_global_batch_size: int
    new_global_batch_size: int
    learning_rate_factor: float  # every learning rate is multiplied by this
    scaling_rule: ScalingRule
    scaling_reason: str
    evidence: NoiseScale  # the noise scale since the last change, that cleared the margin

    def summary(self) -> str:
        """One line: the change, the learning rate's factor and rule, and the evidence."""
        evidence = self.evidence
        return (
            f"global_batch_size {self.old_global_batch_size} -> {self.new_global_batch_size} "
            f"(accumulation_steps {self.old_accumulation_steps} -> {self.new_accumulation_steps}) at "
            f"optimizer step {self.optimizer_step}, learning rate x {self.learning_rate_factor:.4g} "
            f"({self.scaling_rule} rule): B_simple {evidence.b_simple:.4g}, 90% interval "
            f"{evidence.low:.4g}-{evidence.high:.4g} over {evidence.steps} steps at batch sizes "
            f"{evidence.small_batch_size} and {evidence.big_batch_size}"
        )

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["evidence"] = self.evidence.to_dict()
        return data

"""What ``advise`` returns: the evidence of each step it ran, what to change ranked by measured gain,
and the plan at the batch it recommends, as JSON and as the report it prints."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, ClassVar

from batchfit.comparison.comparison import Comparison
from batchfit.data_check.check_data import DataCheck
from batchfit.exploration.explore_result import ExploreResult
from batchfit.policy.explore.advice import Change
from batchfit.policy.explore.time_budget import NotMeasured
from batchfit.policy.plan.plan import Plan
from batchfit.result import stamped
from batchfit.search.search_result import SearchResult


@dataclass(frozen=True)
class Advice:
    """Every step's result (None where skipped, with why in ``skipped``) and the ranked changes."""

    train: SearchResult | None
    eval: SearchResult | None
    exploration: ExploreResult | None
    comparison: Comparison | None
    data: DataCheck | None
    plan: Plan | None
    batch_size: int | None  # the batch advise recommends training at
    changes: tuple[Change, ...]  # worth making, the largest measured gain first
    memory_only: tuple[Change, ...]  # a larger batch at a cost in speed
    within_noise: tuple[Change, ...]  # measured, but the speed-up's interval includes 1: not ranked
    skipped: tuple[str, ...]  # "step: why"
    seconds: float
    not_measured: tuple[NotMeasured, ...] = ()  # the steps the time budget left out, with their seconds
    slower: tuple[Change, ...] = ()  # clearly slower a step than the workload as given: never advised

    command: ClassVar[str] = "advise"

    def to_dict(self) -> dict[str, Any]:
        """Each step's result as its own command writes it (None where skipped), and the changes."""
        parts = {
            "train": self.train,
            "eval": self.eval,
            "exploration": self.exploration,
            "comparison": self.comparison,
            "data": self.data,
            "plan": self.plan,
        }
        data = {
            **{name: None if part is None else part.to_dict() for name, part in parts.items()},
            "batch_size": self.batch_size,
            "changes": [change.to_dict() for change in self.changes],
            "memory_only": [change.to_dict() for change in self.memory_only],
            "within_noise": [change.to_dict() for change in self.within_noise],
            "skipped": list(self.skipped),
            "seconds": self.seconds,
            "not_measured": [part.to_dict() for part in self.not_measured],
            "slower": [change.to_dict() for change in self.slower],
        }
        return stamped(self.command, data)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"

    def summary(self) -> str:
        """The batch to train at, the change that buys most, and the steps run."""
        batch = "no batch size" if self.batch_size is None else f"batch_size {self.batch_size}"
        first = f"; first change: {self.changes[0].what}" if self.changes else "; no change buys more than 3%"
        skipped = f", {len(self.skipped)} steps skipped" if self.skipped else ""
        skipped += f", {len(self.not_measured)} out of time" if self.not_measured else ""
        return f"advise recommends {batch}{first} ({self.seconds:.1f} s{skipped})."

    def table(self, context: str = "") -> str:
        """What to change, as text; ``context`` (the workload and device flags) completes each
        evidence command."""

        def evidence(command: str) -> str:
            return f"(evidence: {f'batchfit {command} {context}'.strip()})"

        lines = []
        if self.train is not None:
            lines.append(
                f"largest memory-safe batch: train {self.train.batch_size}"
                + (f", eval {self.eval.batch_size}" if self.eval is not None else "")
                + f" {evidence('find')}"
            )
        if self.exploration is not None:
            lines.append(f"{_exploration_line(self.exploration)} {evidence('explore')}")
            if self.exploration.goodput is not None:
                lines.append("to a target, at the noise scale given (goodput):")
                lines.extend(f"  {line}" for line in self.exploration.goodput.lines())
        lines.append(
            "what to change, by measured gain:" if self.changes else "nothing measured buys more than 3%."
        )
        lines.extend(f"  {index}. {change.line(context)}" for index, change in enumerate(self.changes, 1))
        if self.memory_only:
            lines.append("when memory, not speed, stops a run:")
            lines.extend(f"  - {change.line(context)}" for change in self.memory_only)
        if self.within_noise:
            lines.append("within noise, not ranked (the speed-up's 90% interval includes 1.00x):")
            lines.extend(f"  - {change.line(context)}" for change in self.within_noise)
        if self.slower:
            lines.append("clearly slower, not advised (one step several times the baseline's):")
            lines.extend(f"  - {change.line(context)}" for change in self.slower)
        if self.plan is not None:
            leaning = self._leaning()
            head = "plan:" if leaning is None else f"plan (at {leaning}, explore's leaning, not settled):"
            lines.extend([head, *(f"  {line}" for line in self.plan.table().splitlines())])
        lines.extend(f"skipped {why}" for why in self.skipped)
        lines.extend(part.line() for part in self.not_measured)
        return "\n".join(lines) + "\n"

    def _leaning(self) -> int | None:
        """The batch advise plans at when it is only explore's leaning, not a settled answer."""
        exploration = self.exploration
        if exploration is None or exploration.unsettled is None:
            return None
        return self.batch_size if self.batch_size == exploration.recommendation.batch_size else None


def _exploration_line(exploration: ExploreResult) -> str:
    """Explore's answer or, under its confidence floor, that it has none yet and what would settle it."""
    recommendation, unsettled = exploration.recommendation, exploration.unsettled
    speed = f"{exploration.estimates()[recommendation.batch_size]:.1f} {exploration.unit}"
    if unsettled is None:
        return (
            f"train at batch_size {recommendation.batch_size}: {speed}, within the tolerance of the "
            f"fastest measured ({recommendation.best_batch_size}), confidence {recommendation.confidence}"
        )
    return (
        f"explore settled no batch size: it leans to {recommendation.batch_size} ({speed}) at "
        f"confidence {recommendation.confidence}, below {recommendation.floor}: the measurements do "
        f"not yet tell the sizes apart; {unsettled.line().removesuffix('.')}"
    )

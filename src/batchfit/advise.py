"""``advise``: the checklist, run on the user's model: find (train and eval), explore, compare and,
given data, check_data, then what to change ranked by its measured gain, with the plan's
learning rate and warm-up for the batch it recommends."""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from batchfit.check_data import DataCheck, check_data
from batchfit.compare import Comparison, compare
from batchfit.errors import ConfigurationError
from batchfit.explore import ExploreResult, explore
from batchfit.find import SearchResult, find_batch_size
from batchfit.policy.advice import Change, costly, rank
from batchfit.policy.plan import Plan, plan
from batchfit.policy.plan_options import Baseline
from batchfit.policy.trial import Trial
from batchfit.runtime.data.dataloaders import LoaderFactory

#: The steps advise runs, in order; each can be skipped.
STEPS = ("find", "explore", "compare", "check-data", "plan")


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
    skipped: tuple[str, ...]  # "step: why"
    seconds: float

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
        return {
            **{name: None if part is None else part.to_dict() for name, part in parts.items()},
            "batch_size": self.batch_size,
            "changes": [change.to_dict() for change in self.changes],
            "memory_only": [change.to_dict() for change in self.memory_only],
            "skipped": list(self.skipped),
            "seconds": self.seconds,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"

    def report(self, context: str = "") -> str:
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
            recommendation = self.exploration.recommendation
            speed = self.exploration.estimates()[recommendation.batch_size]
            lines.append(
                f"train at batch_size {recommendation.batch_size}: {speed:.1f} {self.exploration.unit}, "
                f"within the tolerance of the fastest measured ({recommendation.best_batch_size}), "
                f"confidence {recommendation.confidence} {evidence('explore')}"
            )
        lines.append(
            "what to change, by measured gain:" if self.changes else "nothing measured buys more than 3%."
        )
        lines.extend(f"  {index}. {change.line(context)}" for index, change in enumerate(self.changes, 1))
        if self.memory_only:
            lines.append("when memory, not speed, stops a run:")
            lines.extend(f"  - {change.line(context)}" for change in self.memory_only)
        if self.plan is not None:
            lines.extend(["plan:", *(f"  {line}" for line in self.plan.summary().splitlines())])
        lines.extend(f"skipped {why}" for why in self.skipped)
        return "\n".join(lines) + "\n"


def advise(
    workload: Any,
    *,
    device: str | torch.device | None = None,
    memory_limit: str | int | None = None,
    memory_fraction: float = 0.8,
    skip: Sequence[str] = (),
    batch_size: int | None = None,
    explore_seconds: float = 10.0,
    techniques: Sequence[str] | None = None,
    loader: LoaderFactory | None = None,
    global_batch_size: int | None = None,
    world_size: int = 1,
    base_learning_rate: float | None = None,
    base_batch_size: int | None = None,
    on_step: Callable[[str], None] | None = None,
    on_trial: Callable[[str, Trial], None] | None = None,
) -> Advice:
    """Run the checklist on ``workload``: ``find`` (train and eval), ``explore`` (within
    ``explore_seconds``), ``compare`` (``techniques``, None: the defaults), ``check-data`` (when the
    workload has a dataset or ``loader`` is given) and ``plan`` (with ``base_learning_rate`` and
    ``base_batch_size``: the learning rate and warm-up for ``global_batch_size``, by default the
    recommended batch x ``world_size``). Steps named in ``skip`` are not run. The batch
    recommended, and checked by check-data, is ``batch_size`` when given, else explore's
    recommendation, else find's largest. ``on_step(name)``
    hears each step as it starts, and ``on_trial(label, trial)`` each memory trial of find (label:
    the mode) and compare (label: the technique). The model, optimizer and RNG are left as they were.
    """
    started = time.perf_counter()
    unknown = [step for step in skip if step not in STEPS]
    if unknown:
        raise ConfigurationError(f"skip {unknown}: the steps are {', '.join(STEPS)}.")
    if (base_learning_rate is None) != (base_batch_size is None):
        raise ConfigurationError(
            "plan needs both base_learning_rate and base_batch_size (the batch that learning rate was "
            "tuned for), or neither."
        )
    skipped: list[str] = [f"{step}: asked" for step in skip]

    def starting(step: str) -> bool:
        if step in skip:
            return False
        if on_step is not None:
            on_step(step)
        return True

    train = evaluation = None
    if starting("find"):
        train, evaluation = (
            find_batch_size(
                workload,
                mode,
                device=device,
                memory_limit=memory_limit,
                memory_fraction=memory_fraction,
                on_trial=None if on_trial is None else functools.partial(on_trial, mode),
            )
            for mode in ("train", "eval")
        )
    largest = None if train is None else train.batch_size
    exploration = None
    if starting("explore"):
        exploration = explore(
            workload,
            device=device,
            memory_limit=memory_limit,
            memory_fraction=memory_fraction,
            max_batch_size=largest,
            time_budget_seconds=explore_seconds,
        )
    if batch_size is None:
        batch_size = exploration.recommendation.batch_size if exploration is not None else largest
    comparison = None
    if starting("compare"):
        comparison = compare(
            workload,
            techniques,
            device=device,
            memory_limit=memory_limit,
            memory_fraction=memory_fraction,
            explore_seconds=0,
            on_trial=on_trial,
        )
    data = None
    if "check-data" not in skip:
        if loader is None and workload.dataset is None:
            skipped.append("check-data: the workload has no dataset and no loader was given")
        elif batch_size is None:
            skipped.append("check-data: no batch size to check (find and explore skipped, none given)")
        elif starting("check-data"):
            data = check_data(workload, batch_size, device=device, loader=loader)
    planned = None
    if "plan" not in skip:
        if base_learning_rate is None or base_batch_size is None:
            skipped.append("plan: base_learning_rate and base_batch_size were not given")
        elif batch_size is None and global_batch_size is None:
            skipped.append("plan: no batch size to plan (find and explore skipped, none given)")
        elif starting("plan"):
            planned = plan(
                global_batch_size or (batch_size or 1) * world_size,
                Baseline(base_learning_rate, base_batch_size),
                max_micro_batch_size=largest,
                world_size=world_size,
            )
    changes = _changes(comparison, data)
    return Advice(
        train,
        evaluation,
        exploration,
        comparison,
        data,
        planned,
        batch_size,
        rank(changes),
        costly(changes),
        tuple(skipped),
        time.perf_counter() - started,
    )


def _changes(comparison: Comparison | None, data: DataCheck | None) -> list[Change]:
    """Every change a step measured against the workload as given, before ranking."""
    changes = []
    for row in comparison.rows[1:] if comparison is not None else ():
        if row.applied and row.batch_size is not None:
            changes.append(
                Change(
                    f"{row.technique} ({row.note})",
                    row.throughput_ratio,
                    row.batch_ratio,
                    f"batchfit compare --techniques {row.technique}",
                    row.at_max_batch_size,
                )
            )
    if data is not None and data.recommendation is not None:
        changes.append(
            Change(
                f"load data with {data.recommendation.setting.describe()}",
                data.recommendation.gain,
                None,
                f"batchfit check-data --batch-size {data.batch_size}",
            )
        )
    return changes

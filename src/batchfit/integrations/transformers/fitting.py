"""The batch sizes a Trainer trains and evaluates with (``TrainerPlan``): found by searching its own
step and split so that the global batch stays what its TrainingArguments ask, or read back from the
checkpoint a run resumes from, where each save records them."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from batchfit.errors import ConfigurationError
from batchfit.integrations.transformers.workload import (
    LongestBatches,
    PredictionStep,
    TrainingStep,
    enable_checkpointing,
    loader_data,
    trainer_workload,
)
from batchfit.options import BatchSizes, Trials, Where
from batchfit.policy.plan.micro_batch import MicroBatchChange
from batchfit.policy.plan.plan import Plan, plan
from batchfit.policy.plan.plan_options import Baseline
from batchfit.progress import Event, OnProgress, tell
from batchfit.runtime.workloads.workload import Workload
from batchfit.search.find_batch_size import find_batch_size
from batchfit.search.search_result import SearchResult

#: The file each checkpoint holds the plan in, beside the Trainer's ``trainer_state.json``.
PLAN_FILE = "batchfit_plan.json"


@dataclass(frozen=True)
class TrainerPlan:
    """The sizes a Trainer runs at, ``global_batch_size = per_device_train_batch_size x
    gradient_accumulation_steps x world_size`` (what the TrainingArguments asked), and where they
    come from: a search (``train`` and ``eval`` hold its evidence) or a checkpoint."""

    per_device_train_batch_size: int  # the samples of one batch of the loader, per device
    gradient_accumulation_steps: int  # the loader's batches per optimizer step
    world_size: int
    per_device_eval_batch_size: int
    #: Samples per forward: the loader's batch, halved after an out-of-memory in training.
    micro_batch_size: int
    memory_fraction: float
    device: str  # the device searched, in words (``cpu (capped at 16.00 MiB)``)
    batchfit_version: str
    source: Literal["search", "checkpoint"] = "search"
    changes: tuple[MicroBatchChange, ...] = ()  # of the micro-batch, in training
    eval_changes: tuple[MicroBatchChange, ...] = ()  # of the eval batch, after an out-of-memory
    train: SearchResult | None = field(default=None, repr=False, compare=False)
    eval: SearchResult | None = field(default=None, repr=False, compare=False)

    @property
    def global_batch_size(self) -> int:
        return self.per_device_train_batch_size * self.gradient_accumulation_steps * self.world_size

    @property
    def accumulation_steps(self) -> int:
        """Forwards per optimizer step on each device: the loader's batches, times the micro-batches
        each runs as."""
        return self.gradient_accumulation_steps * math.ceil(
            self.per_device_train_batch_size / self.micro_batch_size
        )

    def summary(self) -> str:
        return (
            f"global_batch_size {self.global_batch_size} = micro_batch_size {self.micro_batch_size} x "
            f"accumulation_steps {self.accumulation_steps} x world_size {self.world_size} "
            f"(per_device_train_batch_size {self.per_device_train_batch_size}, gradient_accumulation_steps "
            f"{self.gradient_accumulation_steps}); per_device_eval_batch_size "
            f"{self.per_device_eval_batch_size}"
        )

    def to_dict(self, evidence: bool = True) -> dict[str, Any]:
        """The plan as JSON takes it; with ``evidence``, the searches' results too."""
        document = {
            field.name: getattr(self, field.name)
            for field in dataclasses.fields(self)
            if field.name not in ("train", "eval")
        }
        document["changes"] = [change.to_dict() for change in self.changes]
        document["eval_changes"] = [change.to_dict() for change in self.eval_changes]
        document["global_batch_size"] = self.global_batch_size
        document["accumulation_steps"] = self.accumulation_steps
        if evidence:
            document["train"] = None if self.train is None else self.train.to_dict()
            document["eval"] = None if self.eval is None else self.eval.to_dict()
        return document

    @classmethod
    def read(cls, checkpoint: str | Path) -> TrainerPlan | None:
        """The plan ``checkpoint`` recorded (``PLAN_FILE``), or None where it holds none."""
        path = Path(checkpoint, PLAN_FILE)
        if not path.is_file():
            return None
        document = json.loads(path.read_text())
        names = {field.name for field in dataclasses.fields(cls)} - {"train", "eval", "source"}
        values = {name: document[name] for name in names if name in document}
        for name in ("changes", "eval_changes"):
            values[name] = tuple(MicroBatchChange(**change) for change in values.get(name, ()))
        return cls(**values, source="checkpoint")

    def write(self, checkpoint: str | Path) -> None:
        Path(checkpoint, PLAN_FILE).write_text(json.dumps(self.to_dict(evidence=False), indent=2) + "\n")


def fit(
    trainer: Any,
    where: Where,
    sizes: BatchSizes,
    trials: Trials,
    steps: tuple[TrainingStep, PredictionStep],
    on_progress: OnProgress | None,
) -> TrainerPlan:
    """The Trainer's plan, searched on its own step: the largest micro-batch that trains (up to the
    per-device batch its arguments ask), the split of its global batch that keeps it, and the
    largest eval batch (up to its eval dataset's length; the smallest of several eval datasets')."""
    from batchfit import __version__

    args = trainer.args
    per_device = args.per_device_train_batch_size * args.gradient_accumulation_steps
    world_size = max(int(args.world_size), 1)

    def search(workload: Workload, mode: Literal["train", "eval"], largest: int) -> SearchResult:
        return find_batch_size(
            workload,
            mode,
            where=where if where.device is not None else replace(where, device=args.device),
            sizes=_at_most(sizes, mode, largest),
            trials=trials,
            on_progress=on_progress,
        )

    enable_checkpointing(trainer)
    with trainer_workload(trainer, *steps, per_device) as (workload, trainer_steps):
        train = search(workload, "train", per_device)
        split = _split(per_device * world_size, world_size, train.batch_size, args)
        for warning in split.warnings:  # accumulation past 16 steps, say
            tell(on_progress, Event("fit", "note", "train", message=f"warning: {warning}"))
        trainer_steps.hold_in_evaluation(split.micro_batch_size, split.accumulation_steps)
        evals = [
            search(workload.replaced(make_batch=LongestBatches(dataset, collate_fn)), "eval", len(dataset))
            for dataset, collate_fn in _eval_data(trainer)
        ]
    evaluated = min(evals, key=lambda result: result.batch_size) if evals else None
    return TrainerPlan(
        per_device_train_batch_size=split.micro_batch_size,
        gradient_accumulation_steps=split.accumulation_steps,
        world_size=world_size,
        per_device_eval_batch_size=(
            args.per_device_eval_batch_size if evaluated is None else evaluated.batch_size
        ),
        micro_batch_size=split.micro_batch_size,
        memory_fraction=where.memory_fraction,
        device=train.device,
        batchfit_version=__version__,
        train=train,
        eval=evaluated,
    )


def apply(trainer: Any, plan: TrainerPlan) -> None:
    """Set the Trainer's arguments to ``plan``'s sizes (and the batch its loader is built with)."""
    if plan.world_size != max(int(trainer.args.world_size), 1):
        raise ConfigurationError(
            f"the checkpoint's plan was made for world_size {plan.world_size}, and this run has "
            f"{trainer.args.world_size} processes: its global batch ({plan.global_batch_size}) would "
            f"not be kept. Resume on {plan.world_size} processes, or delete {PLAN_FILE} from the "
            f"checkpoint to search again at this world size."
        )
    args = trainer.args
    args.per_device_train_batch_size = plan.per_device_train_batch_size
    args.gradient_accumulation_steps = plan.gradient_accumulation_steps
    args.per_device_eval_batch_size = plan.per_device_eval_batch_size
    trainer._train_batch_size = args.train_batch_size  # what get_train_dataloader batches by


def _at_most(sizes: BatchSizes, mode: Literal["train", "eval"], largest: int) -> BatchSizes:
    """``sizes`` for a search that need not go past ``largest`` (the per-device batch asked, the
    eval dataset's length; an eval search no further than eval's default either)."""
    asked = sizes.max_batch_size is not None or mode == "eval"
    return replace(sizes, max_batch_size=min(sizes.upper(mode), largest) if asked else largest)


def _eval_data(trainer: Any) -> list[tuple[Any, Any]]:
    datasets = trainer.eval_dataset
    if datasets is None:
        return []
    many = datasets.values() if isinstance(datasets, dict) else [datasets]
    return [loader_data(trainer, dataset, "evaluation") for dataset in many]


def _split(global_batch_size: int, world_size: int, largest: int, args: Any) -> Plan:
    """``plan``'s split of the global batch into micro-batches of at most ``largest`` samples."""
    try:
        return plan(
            global_batch_size,
            Baseline(float(args.learning_rate), global_batch_size),
            world_size=world_size,
            max_micro_batch_size=largest,
        )
    except ConfigurationError as error:
        error.add_note(
            f"batchfit keeps the global batch the TrainingArguments ask: per_device_train_batch_size "
            f"{args.per_device_train_batch_size} x gradient_accumulation_steps "
            f"{args.gradient_accumulation_steps} x world_size {world_size}; set them to one of those."
        )
        raise

"""``BatchfitTrainer``: the Hugging Face Trainer with batchfit in place of ``auto_find_batch_size``.
It fits the batch sizes before training (or takes them from the checkpoint it resumes from), keeps
the global batch through an out-of-memory in training, and shrinks only the eval batch after one in
evaluation."""

from __future__ import annotations

import gc
import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from transformers import Trainer, TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint

from batchfit.errors import DoesNotFitError
from batchfit.integrations.transformers.fitting import TrainerPlan, apply, fit
from batchfit.integrations.transformers.keywords import check_keywords
from batchfit.integrations.transformers.loss_weights import LossWeights, read_reduction
from batchfit.integrations.transformers.micro_batches import TrainingMicroBatches, predict_in_lockstep
from batchfit.integrations.transformers.workload import LongestBatches, loader_data
from batchfit.options import BatchSizes, Trials, Where
from batchfit.policy.plan.micro_batch import MicroBatchChange
from batchfit.progress import Event
from batchfit.runtime.devices.oom import first_line, is_out_of_memory
from batchfit.runtime.distributed.lockstep import Lockstep
from batchfit.runtime.steps.micro_batches import count_samples
from batchfit.runtime.steps.saved import RngState
from batchfit.units import format_bytes

logger = logging.getLogger(__name__)


class BatchfitMixin:
    """What batchfit adds to a Trainer class: put it first, ``class MyTrainer(BatchfitMixin,
    SFTTrainer)``, or use ``BatchfitTrainer``. The keywords are ``find_batch_size``'s (their types
    checked here), the rest go to the Trainer. ``device`` defaults to the Trainer's (``args.device``).

    Where the plan splits the per-device batch the arguments ask otherwise (or an out-of-memory
    halves it), each micro-batch's loss is weighted so that the optimizer step is the one those
    arguments give; a loss that no weight keeps so is refused (``LossReductionError``)."""

    args: Any
    state: Any
    add_callback: Any
    train_dataset: Any

    def __init__(
        self,
        *args: Any,
        device: str | torch.device | None = None,
        memory_limit: str | int | None = None,
        memory_fraction: float = 0.8,
        sizes: BatchSizes = BatchSizes(),
        trials: Trials = Trials(),
        **kwargs: Any,
    ) -> None:
        check_keywords(device, memory_limit, memory_fraction, sizes, trials)
        self.batchfit_where = Where(device, memory_limit, memory_fraction)  # checked before any work
        self.batchfit_sizes, self.batchfit_trials = sizes, trials
        #: The sizes in force: None until ``fit_batch_sizes`` (or ``train``) sets them.
        self.batchfit_plan: TrainerPlan | None = None
        self._micro_batches: TrainingMicroBatches | None = None
        super().__init__(*args, **kwargs)
        #: The per-device batch the arguments ask, whose optimizer step every plan keeps.
        self.batchfit_asked_batch_size = int(self.args.per_device_train_batch_size)
        self.add_callback(_PlanRecorder(lambda: self.batchfit_plan))

    def fit_batch_sizes(self) -> TrainerPlan:
        """Search the largest micro-batch the Trainer's step trains at and the largest eval batch,
        set ``per_device_train_batch_size`` and ``gradient_accumulation_steps`` to a split of the
        global batch the arguments ask, and ``per_device_eval_batch_size``; ``train`` calls it
        when no plan is in force. The model, optimizer and random state (torch's, CUDA's, numpy's,
        Python's) are left as they were."""
        parent = super()
        rng = RngState.capture()  # the datasets' __getitem__ may draw (augmentation)
        try:
            fitted = fit(
                self,
                self.batchfit_where,
                self.batchfit_sizes,
                self.batchfit_trials,
                (parent.training_step, parent.prediction_step),  # type: ignore[attr-defined]
                self._tell,
            )
        finally:
            rng.restore()
        for result in (fitted.train, fitted.eval):
            if result is not None:
                self._tell(Event("fit", "note", message=result.summary()))  # it names the mode
        self._use(fitted)
        return fitted

    def train(self, resume_from_checkpoint: str | bool | None = None, *args: Any, **kwargs: Any) -> Any:
        """``Trainer.train`` at the plan: the one ``resume_from_checkpoint`` recorded, else the one
        in force, else a new one (``fit_batch_sizes``). The Trainer's own ``auto_find_batch_size``
        is off while it trains: batchfit does its work."""
        checkpoint = _checkpoint(resume_from_checkpoint, self.args.output_dir)
        if resume_from_checkpoint is True and checkpoint is None:  # the Trainer says there is none
            return super().train(resume_from_checkpoint, *args, **kwargs)  # type: ignore[misc]
        recorded = TrainerPlan.read(checkpoint) if checkpoint is not None else None
        if recorded is not None:
            self._use(recorded)
        elif self.batchfit_plan is None:
            self.fit_batch_sizes()
        finder = self.args.auto_find_batch_size
        self.args.auto_find_batch_size = False
        try:
            return super().train(resume_from_checkpoint, *args, **kwargs)  # type: ignore[misc]
        finally:
            self.args.auto_find_batch_size = finder

    def training_step(
        self, model: torch.nn.Module, inputs: Any, num_items_in_batch: Any = None
    ) -> torch.Tensor:
        if self._micro_batches is None:  # no plan in force yet: called outside train
            return super().training_step(model, inputs, num_items_in_batch)  # type: ignore[misc, no-any-return]
        return self._micro_batches.step(self, model, inputs, num_items_in_batch)

    def get_batch_samples(self, epoch_iterator: Any, num_batches: int, device: Any) -> tuple[list[Any], Any]:
        batches, num_items_in_batch = super().get_batch_samples(epoch_iterator, num_batches, device)  # type: ignore[misc]
        if self._micro_batches is not None:  # the optimizer step's samples, as its micro-batches weigh them
            self._micro_batches.group_samples = sum(count_samples(batch, 0) for batch in batches)
        return batches, num_items_in_batch

    def prediction_step(
        self, model: torch.nn.Module, inputs: Any, prediction_loss_only: bool, ignore_keys: Any = None
    ) -> Any:
        parent = super().prediction_step  # type: ignore[misc]
        return predict_in_lockstep(
            lambda: parent(model, inputs, prediction_loss_only, ignore_keys=ignore_keys), Lockstep.current()
        )

    def evaluate(self, *args: Any, **kwargs: Any) -> dict[str, float]:
        """``Trainer.evaluate``, run again at half the eval batch after an out-of-memory (on any
        rank); the training batch is not touched."""
        while True:
            try:
                return super().evaluate(*args, **kwargs)  # type: ignore[misc, no-any-return]
            except BaseException as error:
                if not is_out_of_memory(error):
                    raise
                self._halve_eval_batch(error)

    def _use(self, plan: TrainerPlan) -> None:
        weights = self._loss_weights(plan)
        apply(self, plan)
        self.batchfit_plan = plan
        parent = super().training_step  # type: ignore[misc]
        self._micro_batches = TrainingMicroBatches(
            plan.micro_batch_size, parent, self._micro_batch_changed, weights
        )
        self._tell(Event("fit", "note", message=f"plan from the {plan.source}: {plan.summary()}"))

    def _loss_weights(self, plan: TrainerPlan) -> LossWeights:
        """How the loss adds up over a batch (read on two training examples, the random state put
        back); raises ``LossReductionError`` where ``plan`` splits the batch asked and it cannot
        be weighted."""
        rng = RngState.capture()
        try:
            examples = LongestBatches(*loader_data(self, self.train_dataset, "training"))(2)
        finally:
            rng.restore()
        asked = self.batchfit_asked_batch_size
        weights = LossWeights(asked, *read_reduction(self, examples))
        split = {plan.per_device_train_batch_size, plan.micro_batch_size} != {asked}
        if weights.reduction is None and split:
            raise weights.refusal(
                f"batchfit's plan trains micro_batch_size {plan.micro_batch_size} x accumulation_steps "
                f"{plan.accumulation_steps} where per_device_train_batch_size is {asked}"
            )
        return weights

    def _micro_batch_changed(self, change: MicroBatchChange) -> None:
        plan = self.batchfit_plan
        if plan is None:  # set with the micro-batches, so never None here
            return
        plan = replace(plan, micro_batch_size=change.new_micro_batch_size, changes=(*plan.changes, change))
        self.batchfit_plan = plan
        self._tell(
            Event(
                "fit",
                "note",
                "train",
                batch_size=change.new_micro_batch_size,
                message=(
                    f"micro_batch_size {change.old_micro_batch_size} -> {change.new_micro_batch_size} at "
                    f"optimizer step {change.optimizer_step} ({change.reason}); accumulation_steps "
                    f"{plan.accumulation_steps}, global_batch_size {plan.global_batch_size} unchanged"
                ),
            ),
            logging.WARNING,
        )

    def _halve_eval_batch(self, error: BaseException) -> None:
        old = int(self.args.per_device_eval_batch_size)
        if old <= 1:
            raise DoesNotFitError(
                f"evaluation ran out of memory at per_device_eval_batch_size 1 ({first_line(error)}): not "
                f"even one sample fits beside the training state. Shorten the eval examples, or set "
                f"eval_accumulation_steps so predictions move to the host."
            ) from error
        self.args.per_device_eval_batch_size = old // 2
        getattr(self, "_eval_dataloaders", {}).clear()  # persistent-worker loaders keep their batch
        change = MicroBatchChange(self.state.global_step, old, old // 2, "out of memory in evaluation")
        if self.batchfit_plan is not None:
            plan = self.batchfit_plan
            self.batchfit_plan = replace(
                plan, per_device_eval_batch_size=old // 2, eval_changes=(*plan.eval_changes, change)
            )
        self._tell(
            Event(
                "fit",
                "note",
                "eval",
                batch_size=old // 2,
                message=f"per_device_eval_batch_size {old} -> {old // 2} ({first_line(error)})",
            ),
            logging.WARNING,
        )
        gc.collect()  # the failed batch's activations, held in cycles with its traceback
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def _tell(self, event: Event, level: int = logging.INFO) -> None:
        """Log ``event`` (rank 0 alone speaks; a trial's start at DEBUG); the record carries it as
        ``record.event``."""
        level = logging.DEBUG if event.stage == "started" else level
        if int(self.args.process_index) == 0:
            logger.log(level, "batchfit: %s", _line(event), extra={"event": event})


class BatchfitTrainer(BatchfitMixin, Trainer):  # type: ignore[misc]
    """The Trainer, with its batch sizes fitted by batchfit (``BatchfitMixin``)::

    trainer = BatchfitTrainer(model=model, args=args, train_dataset=train, eval_dataset=test)
    trainer.train()  # fits the sizes first; resume_from_checkpoint keeps the checkpoint's
    """


class _PlanRecorder(TrainerCallback):  # type: ignore[misc]
    """Writes the plan in force into each checkpoint as it is saved (process zero)."""

    def __init__(self, current: Any) -> None:
        self.current = current

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        plan = self.current()
        folder = Path(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
        if plan is not None and args.should_save and folder.is_dir():
            plan.write(folder)


def _checkpoint(resume_from_checkpoint: str | bool | None, output_dir: str) -> str | None:
    """The checkpoint ``Trainer.train`` resumes from: the path given, or for True the last one."""
    if resume_from_checkpoint is True:
        return get_last_checkpoint(output_dir)  # type: ignore[no-any-return]
    return resume_from_checkpoint if isinstance(resume_from_checkpoint, str) else None


def _line(event: Event) -> str:
    if event.stage == "trial" and event.trial is not None:
        peak = format_bytes(event.trial.peak_bytes)
        return f"{event.label} batch_size={event.batch_size}: {event.trial.outcome}, peak {peak}"
    if event.stage == "started":
        return f"{event.label} batch_size={event.batch_size}: trial started"
    return f"{event.label}: {event.message}" if event.label else event.message

"""PyTorch Lightning: ``BatchfitCallback`` finds the train and eval batch sizes at the start of
``fit`` (the eval size also at ``validate`` and ``test``) on the module's own steps as the Trainer
runs them, sets them where the loaders read them, and keeps the plan in the checkpoint."""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loops.evaluation_loop import _EvaluationLoop
from lightning.pytorch.utilities.parsing import lightning_setattr
from torch.utils.data import DataLoader

import batchfit
from batchfit.integrations.lightning_checks import (
    LoaderBatchSizeError,
    check_arguments,
    check_attribute,
    check_first_batch,
    check_fit,
    check_strategy,
    configured_global_batch,
    one_loader,
    warn_batch_norm,
)
from batchfit.integrations.lightning_noise import NoiseScaleCallback
from batchfit.integrations.lightning_plan import (
    CHECKPOINT_KEY,
    GlobalBatch,
    LightningPlan,
    plan_changes,
    split_global_batch,
)
from batchfit.integrations.lightning_search import search_on, trainer_where, up_to
from batchfit.integrations.lightning_steps import (
    MICRO_BATCHES_MEASURED,
    EvalHook,
    LightningSteps,
    lightning_workload,
)
from batchfit.options import BatchSizes, Trials, Where
from batchfit.policy.search.trial import Mode
from batchfit.runtime.devices.resolve import resolve_device
from batchfit.runtime.distributed.lockstep import ranks
from batchfit.search.search_result import SearchResult

__all__ = [
    "CHECKPOINT_KEY",
    "BatchfitCallback",
    "LightningPlan",
    "LoaderBatchSizeError",
    "NoiseScaleCallback",
]

logger = logging.getLogger(__name__)


class BatchfitCallback(Callback):
    """Sets the largest memory-safe batch sizes before Lightning trains (or evaluates).

    At the start of ``fit`` it finds the train batch (and, with ``eval_batch_arg_name``, the
    eval batch) on the module's ``training_step`` / ``validation_step`` as the Trainer runs them:
    its precision plugin, gradient clipping, the optimizer from ``configure_optimizers`` and
    ``accumulate_grad_batches``. Each trial runs under a hard cap at ``memory_fraction`` x the
    device's memory (``memory_limit``: a smaller device, or a CPU standing in for one). The sizes
    go where Lightning's own finder puts them (the module's, its hparams' or its datamodule's
    ``batch_arg_name``) and the loaders are built anew. Under DDP every rank searches in lockstep
    and gets the answer that fits the smallest device. At ``validate`` and ``test`` it finds the
    eval batch and sets ``eval_batch_arg_name`` (default: ``batch_arg_name``).

    Args:
        device, memory_limit, memory_fraction: as ``batchfit.find_batch_size`` takes them;
            ``device`` None is the Trainer's.
        sizes: the sizes searched; its ``global_batch_size`` is the batch of one optimizer step
            over all ranks (default: the train loader's batch size x ``accumulate_grad_batches``
            x world size, as the Trainer is configured).
        trials: how a trial runs.
        batch_arg_name: the attribute the train (and, unless named apart, eval) loaders read.
        eval_batch_arg_name: the attribute the eval loaders read; ``fit`` searches the eval
            batch only when one is named.
        keep_global_batch_size: True keeps the global batch: the micro-batch is the largest
            divisor of each rank's share that fits, and ``accumulate_grad_batches`` makes up the
            rest, so that one optimizer step trains what the configuration trains. False trains
            the largest batch that fits at the Trainer's ``accumulate_grad_batches``: a global
            batch of another size.

    A global batch that splits into equal micro-batches only under half of the size that fits is
    refused (Lightning weights every accumulated batch equally, so uneven ones would change the
    step), and so is a train loader whose first batch is not the planned micro-batch
    (``LoaderBatchSizeError``). A BatchNorm layer normalises over the micro-batch: a warning says
    so when the micro-batch is not the loader's batch.

    ``plan`` (a ``LightningPlan``) and ``results`` (each mode's ``SearchResult``) say what it
    found. The plan goes into checkpoints (``checkpoint["batchfit"]``), and a run resumed from one
    (``ckpt_path=``) with the same devices, world size, memory fraction and global batch uses it
    instead of searching again.
    """

    def __init__(
        self,
        *,
        device: str | torch.device | None = None,
        memory_limit: str | int | None = None,
        memory_fraction: float = 0.8,
        sizes: BatchSizes = BatchSizes(),
        trials: Trials = Trials(),
        batch_arg_name: str = "batch_size",
        eval_batch_arg_name: str | None = None,
        keep_global_batch_size: bool = True,
    ) -> None:
        check_arguments(sizes, trials, batch_arg_name, eval_batch_arg_name, keep_global_batch_size)
        self.where = Where(device, memory_limit, memory_fraction)
        self.sizes, self.trials = sizes, trials
        self.batch_arg_name, self.eval_batch_arg_name = batch_arg_name, eval_batch_arg_name
        self.keep_global_batch_size = keep_global_batch_size
        self.plan: LightningPlan | None = None
        self.results: dict[Mode, SearchResult] = {}
        self._saved: LightningPlan | None = None  # the plan of the checkpoint fit resumes from
        self._unchecked: LightningPlan | None = None  # a plan whose first training batch is to come

    # -- Lightning's hooks ---------------------------------------------------------------

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        check_fit(trainer, pl_module, self.batch_arg_name, self.sizes, self.keep_global_batch_size)
        saved, self._saved, self.results = self._saved, None, {}
        where = trainer_where(self.where, trainer)
        devices = tuple(ranks().run(lambda: resolve_device(where.device, where.memory_limit).name))
        loader = one_loader(trainer.fit_loop._data_source)
        target = self._global_batch(trainer, loader)
        changed = self._changes(saved, trainer, devices, target)
        if saved is not None and not changed:
            self._apply_fit(trainer, pl_module, saved, loader.batch_size)
            self._say(trainer, f"resumed with the checkpoint's plan: {saved.summary()}")
            return
        if saved is not None:
            self._say(trainer, f"searching again, the checkpoint's plan no longer applies: {changed}")
        plan = self._search_fit(trainer, where, devices, loader, target)
        self._apply_fit(trainer, pl_module, plan, loader.batch_size)
        self._say(trainer, plan.summary())

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        plan, self._unchecked = self._unchecked, None
        if plan is not None and plan.micro_batch_size is not None:
            check_first_batch(
                trainer, pl_module, self.batch_arg_name, batch, plan.micro_batch_size, plan.accumulation_steps
            )

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.state.fn == "validate" and not trainer.sanity_checking:
            self._search_eval(trainer, pl_module, trainer.validate_loop, "validation_step")

    def on_test_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._search_eval(trainer, pl_module, trainer.test_loop, "test_step")

    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        if self.plan is not None:
            checkpoint[CHECKPOINT_KEY] = self.plan.to_dict()

    def on_load_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        saved = checkpoint.get(CHECKPOINT_KEY)
        try:
            self._saved = None if saved is None else LightningPlan.from_dict(saved)
        except (KeyError, TypeError) as error:  # another batchfit's plan: search again
            self._saved = None
            self._say(trainer, f"the checkpoint's plan cannot be read ({type(error).__name__}: {error})")

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        # A strategy that restores the checkpoint after the start of fit (ModelParallelStrategy)
        # hands the plan over too late for this fit; the next fit has a checkpoint of its own.
        self._saved = None

    # -- fit -----------------------------------------------------------------------------

    def _global_batch(self, trainer: pl.Trainer, loader: DataLoader[Any]) -> GlobalBatch | None:
        """The global batch the fit keeps: the one passed, else the configured one; None where
        ``keep_global_batch_size=False`` lets it change."""
        if self.sizes.global_batch_size is not None:
            size = self.sizes.global_batch_size
            return GlobalBatch(size, f"sizes.global_batch_size={size}", configured=False)
        return configured_global_batch(trainer, loader) if self.keep_global_batch_size else None

    def _search_fit(
        self,
        trainer: pl.Trainer,
        where: Where,
        devices: tuple[str, ...],
        loader: DataLoader[Any],
        target: GlobalBatch | None,
    ) -> LightningPlan:
        """The train search (and the eval search, when its attribute is named), then the split
        of the global batch kept, if one is."""
        world_size = trainer.world_size
        # Under a global batch the accumulation follows the answer: measured as two micro-batches
        # (the most any accumulation holds), which holds for one too.
        accumulation = MICRO_BATCHES_MEASURED if target is not None else trainer.accumulate_grad_batches
        steps = LightningSteps(trainer, trainer.precision_plugin, accumulation, "validation_step", True)
        optimizer = trainer.optimizers[0]
        sizes = self.sizes if target is None else up_to(self.sizes, target.samples // world_size)
        found = self._search(
            trainer, where, lightning_workload(trainer, loader, steps, optimizer), "train", sizes
        )
        micro, accumulation = found.batch_size, trainer.accumulate_grad_batches
        if target is not None:
            micro, accumulation = split_global_batch(target, world_size, found.batch_size)
        eval_size = None
        source = trainer.fit_loop.epoch_loop.val_loop._data_source
        if self.eval_batch_arg_name is not None and source.is_defined() and trainer.limit_val_batches != 0:
            workload = lightning_workload(trainer, one_loader(source), steps, optimizer)
            eval_size = self._search(trainer, where, workload, "eval", self.sizes).batch_size
        fraction, version = where.memory_fraction, batchfit.__version__
        return LightningPlan(micro, accumulation, world_size, eval_size, devices, fraction, version)

    def _apply_fit(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        plan: LightningPlan,
        loader_batch_size: int | None,
    ) -> None:
        """The plan's sizes set where the loaders read them and its accumulation on the Trainer;
        the fit loop's loaders dropped, so that it builds them anew at these sizes, and the first
        batch they make checked against the plan."""
        if plan.micro_batch_size is not None:
            lightning_setattr(pl_module, self.batch_arg_name, plan.micro_batch_size)
            if trainer.is_global_zero:
                warn_batch_norm(pl_module, loader_batch_size, plan.micro_batch_size)
        if plan.eval_batch_size is not None and self.eval_batch_arg_name is not None:
            lightning_setattr(pl_module, self.eval_batch_arg_name, plan.eval_batch_size)
        trainer.accumulate_grad_batches = plan.accumulation_steps
        trainer.fit_loop._combined_loader = None
        trainer.fit_loop.epoch_loop.val_loop._combined_loader = None
        self.plan, self._unchecked = plan, plan

    def _changes(
        self,
        saved: LightningPlan | None,
        trainer: pl.Trainer,
        devices: tuple[str, ...],
        target: GlobalBatch | None,
    ) -> str:
        """What differs from when the checkpoint's plan was found (empty: nothing), the same on
        every rank: the devices are every rank's."""
        if saved is None:
            return plan_changes(None, {})
        now = {
            "world_size": trainer.world_size,
            "devices": list(devices),
            "memory_fraction": self.where.memory_fraction,
            # Under a global batch kept, that one; else the accumulation that was measured.
            "global_batch_size": saved.global_batch_size if target is None else target.samples,
            "accumulation_steps": (
                saved.accumulation_steps if target is not None else trainer.accumulate_grad_batches
            ),
        }
        return plan_changes(saved, now)

    # -- validate and test ---------------------------------------------------------------

    def _search_eval(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, loop: _EvaluationLoop, hook: EvalHook
    ) -> None:
        """The eval batch of ``validate`` or ``test``, set; the loop's loaders built anew at it."""
        name = self.eval_batch_arg_name or self.batch_arg_name
        check_attribute(pl_module, name, "eval_batch_arg_name")
        check_strategy(trainer)
        where = trainer_where(self.where, trainer)
        steps = LightningSteps(trainer, trainer.precision_plugin, 1, hook, False)
        workload = lightning_workload(trainer, one_loader(loop._data_source), steps, None)
        result = self._search(trainer, where, workload, "eval", self.sizes)
        lightning_setattr(pl_module, name, result.batch_size)
        loop._combined_loader = None
        loop.setup_data()
        loop.reset()
        devices = tuple(ranks().run(lambda: result.device))
        fraction, version = where.memory_fraction, batchfit.__version__
        base = self.plan or LightningPlan(None, 1, trainer.world_size, None, devices, fraction, version)
        self.plan = replace(base, eval_batch_size=result.batch_size)
        self._say(trainer, f"{name}={result.batch_size} for {hook}")

    # -- shared --------------------------------------------------------------------------

    def _search(
        self, trainer: pl.Trainer, where: Where, workload: batchfit.Workload, mode: Mode, sizes: BatchSizes
    ) -> SearchResult:
        self.results[mode] = search_on(trainer, where, workload, mode, sizes, self.trials, logger)
        return self.results[mode]

    def _say(self, trainer: pl.Trainer, message: str) -> None:
        if trainer.is_global_zero:
            logger.info("%s", message)

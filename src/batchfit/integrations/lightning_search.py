"""How ``BatchfitCallback`` searches under a Trainer: where (the device given, else the Trainer's),
``find_batch_size`` with the loop's logging set aside, and its progress told to a logger."""

from __future__ import annotations

import logging
from dataclasses import replace

import lightning.pytorch as pl

import batchfit
from batchfit.integrations.lightning_steps import scratch_logging
from batchfit.options import BatchSizes, Trials, Where
from batchfit.policy.search.trial import Mode
from batchfit.progress import Event
from batchfit.search.find_batch_size import find_batch_size
from batchfit.search.search_result import SearchResult
from batchfit.units import format_bytes


def trainer_where(where: Where, trainer: pl.Trainer) -> Where:
    """Where the search runs: the device given, else the Trainer's."""
    device = where.device if where.device is not None else trainer.strategy.root_device
    return Where(device, where.memory_limit, where.memory_fraction)


def search_on(
    trainer: pl.Trainer,
    where: Where,
    workload: batchfit.Workload,
    mode: Mode,
    sizes: BatchSizes,
    trials: Trials,
    logger: logging.Logger,
) -> SearchResult:
    """``find_batch_size`` with the loop's logging set aside; rank 0 tells ``logger``."""
    speak = trainer.is_global_zero

    def tell(event: Event) -> None:
        tell_trial(logger, event)

    with scratch_logging(trainer):
        result = find_batch_size(
            workload,
            mode,
            where=where,
            sizes=replace(sizes.for_mode(mode), global_batch_size=None, world_size=None),
            trials=trials,
            on_progress=tell if speak else None,
        )
    if speak:
        logger.info("%s", result.summary())
    return result


def tell_trial(logger: logging.Logger, event: Event) -> None:
    """A search's progress, to ``logger``: one line per trial."""
    trial = event.trial
    if event.stage == "trial" and trial is not None:
        peak = format_bytes(trial.peak_bytes) if trial.peak_bytes else "-"
        logger.info("%s batch_size=%d: %s, peak %s", event.label, trial.batch_size, trial.outcome, peak)


def up_to(sizes: BatchSizes, per_device: int) -> BatchSizes:
    """``sizes`` as the search under a global batch takes them: up to the batch each rank trains."""
    return replace(sizes, max_batch_size=min(sizes.upper("train"), per_device))

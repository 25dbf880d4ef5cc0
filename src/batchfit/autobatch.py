"""At the start of training: run the searches an experiment config asks for, write the sizes in."""

from __future__ import annotations

import logging
from typing import Any

from batchfit.config import ExperimentConfig
from batchfit.find import SearchResult, find_batch_size
from batchfit.search import Trial
from batchfit.units import format_bytes
from batchfit.workload import Workload, load_workload

logger = logging.getLogger(__name__)


def workload_from_config(cfg: ExperimentConfig) -> Workload:
    """The config's WORKLOAD (``example:NAME`` or ``module:function``), on the config's DEVICE."""
    return load_workload(cfg.WORKLOAD, device=cfg.DEVICE, source="WORKLOAD")


def apply_autobatch(cfg: ExperimentConfig, workload: Workload) -> list[SearchResult]:
    """Search the train (``ENABLED``) and eval (``ENABLED_VAL``) batch sizes and overwrite
    ``DATA.BATCH_SIZE`` / ``DATA.BATCH_SIZE_VAL`` in ``cfg``; the trials are logged at
    ``LOG_LEVEL`` (``LOG_LEVEL_VAL``) and each choice at INFO. Returns the searches' results."""
    auto = cfg.DATA.AUTOBATCH
    results = []
    for mode, suffix, enabled in (("train", "", auto.ENABLED), ("eval", "_VAL", auto.ENABLED_VAL)):
        if not enabled:
            continue

        def setting(key: str, suffix: str = suffix) -> Any:
            return getattr(auto, key + suffix)

        result = _search(
            cfg,
            workload,
            mode,
            setting("TARGET_MEMORY_FRACTION"),
            setting("MIN_BATCH_SIZE"),
            setting("MAX_BATCH_SIZE"),
            setting("STEPS_PER_TRIAL"),
            setting("LOG_LEVEL"),
        )
        key = "BATCH_SIZE" + suffix
        logger.info("autobatch: DATA.%s %d -> %d", key, getattr(cfg.DATA, key), result.batch_size)
        setattr(cfg.DATA, key, result.batch_size)
        results.append(result)
    return results


def _search(
    cfg: ExperimentConfig,
    workload: Workload,
    mode: str,
    fraction: float,
    min_batch: int,
    max_batch: int,
    steps: int,
    level_name: str,
) -> SearchResult:
    level = logging.getLevelName(level_name.upper())

    def log_trial(trial: Trial) -> None:
        logger.log(
            level,
            "autobatch %s trial batch_size=%d: %s, peak %s",
            mode,
            trial.batch_size,
            trial.outcome,
            format_bytes(trial.peak_bytes),
        )

    result = find_batch_size(
        workload,
        mode,  # type: ignore[arg-type]
        device=cfg.DEVICE,
        memory_limit=cfg.MEMORY_LIMIT,
        fraction=fraction,
        min_batch=min_batch,
        max_batch=max_batch,
        steps_per_trial=steps,
        on_trial=log_trial,
    )
    logger.log(level, "autobatch: %s", result.summary())
    return result

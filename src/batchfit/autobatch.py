"""At the start of training: run the searches an experiment config asks for, write the sizes in."""

from __future__ import annotations

import logging

from batchfit.analyze import Bounds
from batchfit.config import ExperimentConfig
from batchfit.find import SearchResult, find_batch_size
from batchfit.policy.trial import Mode, Trial
from batchfit.runtime.workloads.specs import load_workload
from batchfit.runtime.workloads.workload import Workload
from batchfit.units import format_bytes

logger = logging.getLogger(__name__)


def workload_from_config(cfg: ExperimentConfig) -> Workload:
    """The config's WORKLOAD (``example:NAME`` or ``module:function``), on the config's DEVICE."""
    return load_workload(cfg.WORKLOAD, device=cfg.DEVICE, source="WORKLOAD")


def bounds_from_config(cfg: ExperimentConfig) -> dict[Mode, Bounds]:
    """Each mode's search bounds as ``DATA.AUTOBATCH`` sets them (eval's are the ``_VAL`` keys)."""
    auto = cfg.DATA.AUTOBATCH
    return {
        "train": Bounds(auto.MIN_BATCH_SIZE, auto.MAX_BATCH_SIZE, auto.STEPS_PER_TRIAL),
        "eval": Bounds(auto.MIN_BATCH_SIZE_VAL, auto.MAX_BATCH_SIZE_VAL, auto.STEPS_PER_TRIAL_VAL),
    }


def apply_autobatch(cfg: ExperimentConfig, workload: Workload) -> list[SearchResult]:
    """Search the train (``ENABLED``) and eval (``ENABLED_VAL``) batch sizes and overwrite
    ``DATA.BATCH_SIZE`` / ``DATA.BATCH_SIZE_VAL`` in ``cfg``; the trials are logged at
    ``LOG_LEVEL`` (``LOG_LEVEL_VAL``) and each choice at INFO. Returns the searches' results."""
    auto = cfg.DATA.AUTOBATCH
    bounds = bounds_from_config(cfg)
    results = []
    modes: tuple[tuple[Mode, str, bool], ...] = (
        ("train", "", auto.ENABLED),
        ("eval", "_VAL", auto.ENABLED_VAL),
    )
    for mode, suffix, enabled in modes:
        if not enabled:
            continue
        fraction = getattr(auto, "TARGET_MEMORY_FRACTION" + suffix)
        result = _search(cfg, workload, mode, fraction, bounds[mode], getattr(auto, "LOG_LEVEL" + suffix))
        key = "BATCH_SIZE" + suffix
        logger.info("autobatch: DATA.%s %d -> %d", key, getattr(cfg.DATA, key), result.batch_size)
        setattr(cfg.DATA, key, result.batch_size)
        results.append(result)
    return results


def _search(
    cfg: ExperimentConfig,
    workload: Workload,
    mode: Mode,
    memory_fraction: float,
    bounds: Bounds,
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
        mode,
        device=cfg.DEVICE,
        memory_limit=cfg.MEMORY_LIMIT,
        memory_fraction=memory_fraction,
        min_batch_size=bounds.min_batch_size,
        max_batch_size=bounds.max_batch_size,
        steps_per_trial=bounds.steps_per_trial,
        on_trial=log_trial,
    )
    logger.log(level, "autobatch: %s", result.summary())
    return result

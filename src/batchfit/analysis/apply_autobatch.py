"""Experiment configs' searches: at the start of training, the sizes a config asks for written into
it (``apply_autobatch``); outside training, its searches at several memory fractions
(``analyze_config``)."""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from typing import Any

from batchfit.analysis.analyze import Analysis, analyze
from batchfit.analysis.config import SEARCH_KEYS, AutobatchConfig, ExperimentConfig
from batchfit.options import BatchSizes, Trials, Where
from batchfit.policy.search.trial import Mode
from batchfit.progress import Event, OnProgress
from batchfit.runtime.workloads.specs import load_workload
from batchfit.runtime.workloads.workload import Workload
from batchfit.search.find_batch_size import find_batch_size
from batchfit.search.search_result import SearchResult
from batchfit.units import format_bytes

logger = logging.getLogger(__name__)

#: Each mode's keys in DATA.AUTOBATCH: eval's are the _VAL twins.
SUFFIXES: dict[Mode, str] = {"train": "", "eval": "_VAL"}


def workload_from_config(cfg: ExperimentConfig) -> Workload:
    """The config's WORKLOAD (``example:NAME`` or ``module:function``), on the config's DEVICE."""
    return load_workload(cfg.WORKLOAD, device=cfg.DEVICE, source="WORKLOAD")


def fields_from_config(auto: AutobatchConfig, mode: Mode, kind: type) -> dict[str, Any]:
    """The fields of options object ``kind`` that ``DATA.AUTOBATCH`` sets for a ``mode`` search."""
    suffix = SUFFIXES[mode]
    return {name: getattr(auto, key + suffix) for key, (owner, name) in SEARCH_KEYS.items() if owner is kind}


def sizes_from_config(auto: AutobatchConfig, mode: Mode) -> BatchSizes:
    """The sizes a ``mode`` search may answer, as ``DATA.AUTOBATCH`` sets them."""
    return BatchSizes(**fields_from_config(auto, mode, BatchSizes))


def where_from_config(cfg: ExperimentConfig, mode: Mode) -> Where:
    """Where a ``mode`` search runs: the config's DEVICE and MEMORY_LIMIT, at its share of memory."""
    return Where(cfg.DEVICE, cfg.MEMORY_LIMIT, **fields_from_config(cfg.DATA.AUTOBATCH, mode, Where))


def trials_from_config(auto: AutobatchConfig, mode: Mode) -> Trials:
    return Trials(**fields_from_config(auto, mode, Trials))


def apply_autobatch(cfg: ExperimentConfig, workload: Workload) -> list[SearchResult]:
    """Search the train (``ENABLED``) and eval (``ENABLED_VAL``) batch sizes and overwrite
    ``DATA.BATCH_SIZE`` / ``DATA.BATCH_SIZE_VAL`` in ``cfg``; the trials are logged at
    ``LOG_LEVEL`` (``LOG_LEVEL_VAL``) and each choice at INFO. Returns the searches' results."""
    auto = cfg.DATA.AUTOBATCH
    results = []
    for mode, suffix in SUFFIXES.items():
        if not getattr(auto, "ENABLED" + suffix):
            continue
        level = logging.getLevelName(getattr(auto, "LOG_LEVEL" + suffix).upper())
        result = find_batch_size(
            workload,
            mode,
            where=where_from_config(cfg, mode),
            sizes=sizes_from_config(auto, mode),
            trials=trials_from_config(auto, mode),
            on_progress=functools.partial(_log_trial, level=level),
        )
        logger.log(level, "autobatch: %s", result.summary())
        key = "BATCH_SIZE" + suffix
        logger.info("autobatch: DATA.%s %d -> %d", key, getattr(cfg.DATA, key), result.batch_size)
        setattr(cfg.DATA, key, result.batch_size)
        results.append(result)
    return results


def analyze_config(
    cfg: ExperimentConfig,
    workload: Workload,
    memory_fractions: Sequence[float],
    modes: Sequence[str] = ("train", "eval"),
    on_progress: OnProgress | None = None,
) -> Analysis:
    """``analyze`` on the config's device and memory limit, each mode's search bounded and
    stepped as ``DATA.AUTOBATCH`` says."""
    auto = cfg.DATA.AUTOBATCH
    return analyze(
        workload,
        memory_fractions,
        modes,
        where=Where(cfg.DEVICE, cfg.MEMORY_LIMIT),
        sizes_by_mode={mode: sizes_from_config(auto, mode) for mode in SUFFIXES},
        trials_by_mode={mode: trials_from_config(auto, mode) for mode in SUFFIXES},
        on_progress=on_progress,
    )


def _log_trial(event: Event, *, level: int) -> None:
    if event.stage == "trial" and event.trial is not None:
        trial = event.trial
        logger.log(
            level,
            "autobatch %s trial batch_size=%d: %s, peak %s",
            event.label,
            trial.batch_size,
            trial.outcome,
            format_bytes(trial.peak_bytes),
        )

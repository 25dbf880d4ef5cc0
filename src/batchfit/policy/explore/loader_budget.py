"""The data check's time, free of torch: what measuring a DataLoader setting is expected to cost,
from the rows already measured, and which settings of ``try_settings``'s plan a spent budget left
unmeasured, each named with the seconds it would need (``NotMeasured``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from batchfit.policy.explore.loader_settings import (
    PREFETCH_FACTORS,
    LoaderSetting,
    SettingRow,
    with_workers,
    worker_ladder,
)
from batchfit.policy.explore.time_budget import NotMeasured

#: Why a setting is left out when the budget stops the trying.
OUT_OF_TIME = "the time budget ran out"


def expected_seconds(
    setting: LoaderSetting,
    measured: Sequence[SettingRow],
    *,
    batch_size: int,
    window_seconds: float,
    min_batches: int,
) -> float:
    """Seconds the together loop is expected to take on ``setting``: the workers' start (the longest
    measured), a warm-up round (one batch per worker, one without) and a window of at least
    ``window_seconds`` and ``min_batches`` batches. Each batch takes as long as at the slowest rate
    measured: more workers load faster, so the estimate errs long, never short."""
    if not measured:
        raise ValueError("expected_seconds needs at least one measured row (the current setting's)")
    batch_seconds = batch_size / max(1e-9, min(row.samples_per_second for row in measured))
    startup = max(row.startup_seconds for row in measured)
    warm_up = max(1, setting.num_workers) * batch_seconds
    return startup + warm_up + max(window_seconds, min_batches * batch_seconds)


def settings_left(
    current: LoaderSetting,
    measured: Sequence[SettingRow],
    *,
    max_num_workers: int,
    knobs: Sequence[str],
    cuda: bool,
) -> tuple[LoaderSetting, ...]:
    """The settings ``try_settings`` would still measure after ``measured``, in its order: the
    ladder's rungs not measured, then ``prefetch_factor`` and (on CUDA) ``pin_memory`` at the
    ladder's top when rungs are left (a climb that goes on ends there, or earlier), else at the
    fastest worker count measured."""
    done = {row.setting for row in measured}
    left: list[LoaderSetting] = []
    if "num_workers" in knobs:
        rungs = (with_workers(current, workers) for workers in worker_ladder(max_num_workers))
        left += [setting for setting in rungs if setting not in done]
    if left:  # the climb goes on to the ladder's top, where the fastest is expected
        base = left[-1]
    else:
        base = max(measured, key=lambda row: row.samples_per_second).setting if measured else current
    if base.num_workers > 0 and "prefetch_factor" in knobs:
        left += [replace(base, prefetch_factor=factor) for factor in PREFETCH_FACTORS]
    if cuda and "pin_memory" in knobs and not base.pin_memory:
        left.append(replace(base, pin_memory=True))
    return tuple(setting for setting in dict.fromkeys(left) if setting not in done)


def not_measured(
    left: Sequence[LoaderSetting],
    measured: Sequence[SettingRow],
    *,
    batch_size: int,
    window_seconds: float,
    min_batches: int,
) -> tuple[NotMeasured, ...]:
    """Each setting in ``left``, named with the seconds measuring it is expected to take."""
    return tuple(
        NotMeasured(
            setting.describe(),
            OUT_OF_TIME,
            expected_seconds(
                setting,
                measured,
                batch_size=batch_size,
                window_seconds=window_seconds,
                min_batches=min_batches,
            ),
        )
        for setting in left
    )

"""``check_data``: whether data loading holds training back at a batch size, and the DataLoader
setting that stops it, measured within one time budget. The decisions are the policy's
(``batchfit.policy.explore.loader_settings``, ``loader_budget``); this module times real loaders and
steps for it and reports."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from typing_extensions import Unpack

from batchfit.checks import check_positive_int
from batchfit.data_check.data_check_result import DataCheck
from batchfit.options import Timing, Where
from batchfit.policy.explore.loader_budget import expected_seconds, not_measured, settings_left
from batchfit.policy.explore.loader_settings import (
    KNOBS,
    WAIT_SHARE_THRESHOLD,
    DataCheckStopReason,
    LoaderRecommendation,
    LoaderSearch,
    LoaderSetting,
    SettingRow,
    is_bottleneck,
    recommend,
    try_settings,
)
from batchfit.policy.explore.time_budget import NotMeasured, TimeBudget
from batchfit.progress import Event, OnProgress, tell
from batchfit.runtime.data.dataloaders import LoaderFactory, LoaderSource
from batchfit.runtime.data.loop import MIN_TIMED_BATCHES, PROGRESS_SECONDS, DataLoop
from batchfit.runtime.devices.device import Device
from batchfit.runtime.devices.host import usable_cores
from batchfit.runtime.workloads.entry import check_entry
from batchfit.runtime.workloads.specs import load_function
from batchfit.runtime.workloads.workload import Workload, check_model_on
from batchfit.where import DeviceShorthand, target_of

__all__ = ["CHECK_DATA_TIMING", "DataCheck", "check_data"]

#: check_data's default: the whole check within a minute. The three passes and the few settings a
#: loader with workers needs take about 10 s on a 2-core machine (1 s windows); a many-core machine's
#: longer ladder of worker counts fits too, and a slow step or loader stops early, saying what is left.
CHECK_DATA_TIMING = Timing(time_budget_seconds=60.0)
#: The three passes' shares of what is left when each starts: the loader alone, the step alone, the
#: two together (the last takes all that is left). They bind only on a budget of a few windows.
PASS_SHARES = (1 / 3, 1 / 2, 1.0)


def check_data(
    workload: Workload,
    batch_size: int,
    *,
    where: Where | None = None,
    loader: LoaderFactory | str | None = None,
    search: LoaderSearch = LoaderSearch(),
    timing: Timing = CHECK_DATA_TIMING,
    on_progress: OnProgress | None = None,
    **shorthand: Unpack[DeviceShorthand],
) -> DataCheck:
    """Measure whether loading the data holds training back at ``batch_size``, and what fixes it.

    The batches come from ``loader(batch_size=..., num_workers=..., pin_memory=...,
    persistent_workers=..., prefetch_factor=...) -> DataLoader`` (a function, or its
    ``module:function`` spec), called with only the keywords its signature names (all of them
    with ``**kwargs``; only those are varied), or else from a DataLoader over the workload's
    map-style ``dataset`` (shuffled, ``drop_last=True``). ``search.current`` is the setting used now.
    Three passes time the loader alone, the step alone and the two together; when the loader is
    the bottleneck (more than ``WAIT_SHARE_THRESHOLD`` of the loop waits for data), settings are
    tried up to ``search.max_num_workers`` (default: the cores this process may use) and the
    cheapest within ``search.tolerance`` of the fastest is recommended. Each pass times at least
    ``search.window_seconds``. ``timing.time_budget_seconds`` (alone of ``Timing``'s fields read
    here; default 60 s, None: no bound) is the whole check's: a setting is started only if its
    expected time (``loader_budget.expected_seconds``, from the passes measured) fits in what is
    left, and each one left is named in ``DataCheck.not_measured`` with the seconds it would
    need; the three passes always run, their windows shortened (to one batch at least) where the
    budget is smaller than they are. ``on_progress`` hears each pass as it starts (``started``,
    with the time left), a ``note`` at least every few seconds within it, and each setting as it
    is measured (``setting``), the current one first. The model, optimizer and RNG are left as
    they were. docs/check-data.md explains. ``where`` says where to measure (a
    ``batchfit.Where``; its device alone matters here), ``device`` its shorthand.
    """
    budget = TimeBudget(timing.time_budget_seconds) if isinstance(timing, Timing) else TimeBudget(None)
    check_entry(
        "check_data",
        workload,
        on_progress,
        search=(search, LoaderSearch),
        timing=(timing, Timing),
    )
    check_positive_int("batch_size", batch_size)
    target = target_of("check_data", where, shorthand, DeviceShorthand.__optional_keys__).device
    if search.max_num_workers is None:
        search = replace(search, max_num_workers=usable_cores())
    factory = load_function(loader, "loader") if isinstance(loader, str) else loader
    source = LoaderSource(workload, batch_size, factory)
    current = search.current
    source.check(current)
    check_model_on(workload.module, target.torch_device)
    return _Check(source, current, search, _Pace(budget, on_progress), on_progress).run(target)


@dataclass
class _Pace:
    """The check's one budget and what it says while it works: each pass's share of what is left,
    an event as the pass starts, and a note after the first batch or step that ends
    ``PROGRESS_SECONDS`` or more after the last event, each with the time left."""

    budget: TimeBudget
    on_progress: OnProgress | None
    what: str = ""
    told: float = 0.0  # budget.spent() when the last event was told

    def begin(self, what: str, share: float) -> TimeBudget:
        self.what, self.told = what, self.budget.spent()
        tell(self.on_progress, Event("check-data", "started", f"{what} ({self.left()})", message=what))
        return self.budget.part(share)

    def batch(self, batches: int) -> None:
        if self.budget.spent() - self.told < PROGRESS_SECONDS:
            return
        self.told = self.budget.spent()
        done = "warming up" if batches == 0 else f"{batches} timed batch(es)"
        message = f"{self.what}: {done}, {self.budget.spent():.0f} s in; {self.left()}"
        tell(self.on_progress, Event("check-data", "note", self.what, message=message))

    def left(self) -> str:
        left = self.budget.left()
        return "no time budget" if math.isinf(left) else f"{left:.0f} s of the time budget left"


@dataclass(frozen=True)
class _Check:
    """One data check: the three passes at the current setting and, where the loader is the
    bottleneck, the settings tried, each told as it comes and none started that the time left
    does not fit."""

    source: LoaderSource
    current: LoaderSetting
    search: LoaderSearch
    pace: _Pace
    on_progress: OnProgress | None

    def run(self, target: Device) -> DataCheck:
        batch_size, source, tolerance = self.source.batch_size, self.source, self.search.tolerance
        window, (alone, step, both) = self.search.window_seconds, PASS_SHARES
        with DataLoop(source.workload, target, source, window, self.pace) as loop:
            loader_rate = loop.loader_alone(self.current, alone)
            step_rate = loop.step_alone(step)
            now, busy_share = loop.together(self.current, both)
            self.heard(now)
            settings, stop = self.tried(loop, now)
        epoch = loop.batches_per_epoch
        chosen = recommend(
            now,
            settings,
            tolerance=tolerance,
            batch_size=batch_size,
            batches_per_epoch=epoch,
            knobs=source.knobs,
        )
        return DataCheck(
            batch_size,
            target.name,
            source.description,
            loader_rate,
            step_rate,
            now.samples_per_second,
            now.data_wait_share,
            busy_share,
            is_bottleneck(now.data_wait_share),
            WAIT_SHARE_THRESHOLD,
            tolerance,
            settings,
            chosen,
            stop,
            epoch,
            _notes(source, target.torch_device.type, chosen, epoch),
            self.pace.budget.spent(),
            self.pace.budget.seconds,
            self.left_out(settings, stop, cuda=target.torch_device.type == "cuda"),
        )

    def tried(self, loop: DataLoop, now: SettingRow) -> tuple[tuple[SettingRow, ...], DataCheckStopReason]:
        if not is_bottleneck(now.data_wait_share):
            return (now,), "not_bottleneck"

        def measure(setting: LoaderSetting) -> SettingRow:
            return self.heard(loop.together(setting)[0])

        return try_settings(
            now,
            measure,
            max_num_workers=self.search.max_num_workers or 0,
            knobs=self.source.knobs,
            cuda=loop.device.torch_device.type == "cuda",
            tolerance=self.search.tolerance,
            fits=self.fits,
        )

    def fits(self, setting: LoaderSetting, rows: Sequence[SettingRow]) -> bool:
        """Whether ``setting``'s expected time, from the rows measured, fits in what is left."""
        return self.pace.budget.allows(self.expected(setting, rows))

    def expected(self, setting: LoaderSetting, rows: Sequence[SettingRow]) -> float:
        return expected_seconds(
            setting,
            rows,
            batch_size=self.source.batch_size,
            window_seconds=self.search.window_seconds,
            min_batches=MIN_TIMED_BATCHES,
        )

    def left_out(
        self, rows: tuple[SettingRow, ...], stop: DataCheckStopReason, *, cuda: bool
    ) -> tuple[NotMeasured, ...]:
        """The settings the budget stopped before, each with the seconds it would need."""
        if stop != "time_budget":
            return ()
        left = settings_left(
            self.current,
            rows,
            max_num_workers=self.search.max_num_workers or 0,
            knobs=self.source.knobs,
            cuda=cuda,
        )
        return not_measured(
            left,
            rows,
            batch_size=self.source.batch_size,
            window_seconds=self.search.window_seconds,
            min_batches=MIN_TIMED_BATCHES,
        )

    def heard(self, row: SettingRow) -> SettingRow:
        message = (
            f"{row.setting.describe():<40} {row.samples_per_second:10.1f} samples/s  "
            f"data wait {row.data_wait_share:6.1%}"
        )
        tell(self.on_progress, Event("check-data", "setting", row.setting.describe(), message=message))
        return row


def _notes(
    source: LoaderSource,
    device_type: str,
    recommendation: LoaderRecommendation | None,
    batches_per_epoch: int | None,
) -> tuple[str, ...]:
    """What was not tried, and why; what persistent_workers would save."""
    if recommendation is None:
        return ()
    notes = []
    missing = [knob for knob in KNOBS if knob not in source.knobs]
    if missing:
        notes.append(f"{', '.join(missing)} not tried: {source.description} has no such parameter.")
    if device_type == "cpu" and "pin_memory" in source.knobs:
        notes.append("pin_memory not tried: on the CPU there is no host-to-device copy for it to speed up.")
    row = recommendation.row
    if row.setting.num_workers > 0 and "persistent_workers" in source.knobs:
        epoch = f"epoch of {batches_per_epoch} batches" if batches_per_epoch else "epoch"
        saving = recommendation.startup_share
        notes.append(
            f"persistent_workers is not timed (within an epoch it changes nothing): it saves the "
            f"workers' start once per {epoch}: at num_workers={row.setting.num_workers} the first "
            f"batch came {row.startup_seconds:.2f} s after iter(loader)"
            + ("." if saving is None else f", {saving:.1%} of an epoch beyond one batch's loading.")
        )
    return tuple(notes)

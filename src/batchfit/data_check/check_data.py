"""``check_data``: whether data loading holds training back at a batch size, and the DataLoader
setting that stops it, measured. The decisions are the policy's (``batchfit.policy.explore.loader_settings``);
this module times real loaders and steps for it and reports."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from typing_extensions import Unpack

from batchfit.checks import check_positive_int
from batchfit.options import Where
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
from batchfit.progress import Event, OnProgress, tell
from batchfit.result import stamped
from batchfit.runtime.data.dataloaders import LoaderFactory, LoaderSource
from batchfit.runtime.data.loop import DataLoop
from batchfit.runtime.devices.device import Device
from batchfit.runtime.devices.host import usable_cores
from batchfit.runtime.workloads.entry import check_entry
from batchfit.runtime.workloads.specs import load_function
from batchfit.runtime.workloads.workload import Workload, check_model_on
from batchfit.where import DeviceShorthand, target_of


@dataclass(frozen=True)
class DataCheck:
    """The three measurements at ``batch_size``, the verdict, every setting tried, the advice."""

    batch_size: int
    device: str
    source: str  # "the workload's dataset" or "loader=FACTORY"
    loader_samples_per_second: float  # the loader alone, at the current setting
    step_samples_per_second: float  # training steps on a batch already in memory
    together_samples_per_second: float  # the loader feeding the steps, as training runs them
    data_wait_share: float  # of that loop's time, waiting in next(iterator) and the copy
    device_busy_share: float  # of that loop's time, inside the steps (CUDA events on a GPU)
    bottleneck: bool  # data_wait_share above threshold
    threshold: float
    tolerance: float
    settings: tuple[SettingRow, ...]  # the current setting first, then each one tried
    recommendation: LoaderRecommendation | None  # None when the loader is not the bottleneck
    stop_reason: DataCheckStopReason
    batches_per_epoch: int | None
    notes: tuple[str, ...]
    seconds: float

    def summary(self) -> str:
        wait = f"{self.data_wait_share:.0%} of each step waits for data (threshold {self.threshold:.0%})"
        if self.recommendation is None:
            return f"the loader is not the bottleneck at batch_size={self.batch_size}: {wait}."
        advice = self.recommendation.summary()
        if self.stop_reason == "time_budget":
            advice += f" (time_budget_seconds ran out after {len(self.settings)} setting(s) measured.)"
        return f"the loader is the bottleneck at batch_size={self.batch_size}: {wait}; {advice}"

    command: ClassVar[str] = "check-data"

    def to_dict(self) -> dict[str, Any]:
        data = {
            "batch_size": self.batch_size,
            "device": self.device,
            "source": self.source,
            "loader_samples_per_second": self.loader_samples_per_second,
            "step_samples_per_second": self.step_samples_per_second,
            "together_samples_per_second": self.together_samples_per_second,
            "data_wait_share": self.data_wait_share,
            "device_busy_share": self.device_busy_share,
            "bottleneck": self.bottleneck,
            "threshold": self.threshold,
            "tolerance": self.tolerance,
            "settings": [row.to_dict() for row in self.settings],
            "recommendation": None if self.recommendation is None else self.recommendation.to_dict(),
            "stop_reason": self.stop_reason,
            "batches_per_epoch": self.batches_per_epoch,
            "notes": list(self.notes),
            "seconds": self.seconds,
            "summary": self.summary(),
        }
        return stamped(self.command, data)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"

    def table(self) -> str:
        lines = [
            f"batch_size={self.batch_size} on {self.device}, batches from {self.source}",
            f"  loader alone  {self.loader_samples_per_second:>10.1f} samples/s",
            f"  step alone    {self.step_samples_per_second:>10.1f} samples/s",
            (
                f"  together      {self.together_samples_per_second:>10.1f} samples/s   data wait "
                f"{self.data_wait_share:.1%}, device busy {self.device_busy_share:.1%}"
            ),
            "",
            (
                f"{'num_workers':>11}  {'prefetch_factor':>15}  {'pin_memory':>10}  {'samples/s':>10}  "
                f"{'data wait':>9}  {'startup s':>9}"
            ),
        ]
        chosen = None if self.recommendation is None else self.recommendation.row.setting
        for index, row in enumerate(self.settings):
            marks = (["current"] if index == 0 else []) + (["recommended"] if row.setting == chosen else [])
            setting = row.setting
            lines.append(
                f"{setting.num_workers:>11}  {setting.effective_prefetch_factor or '-':>15}  "
                f"{setting.pin_memory!s:>10}  {row.samples_per_second:>10.1f}  {row.data_wait_share:>9.1%}  "
                f"{row.startup_seconds:>9.2f}{'  <- ' + ', '.join(marks) if marks else ''}"
            )
        lines += [f"note: {note}" for note in self.notes]
        lines.append(self.summary())
        return "\n".join(lines) + "\n"


def check_data(
    workload: Workload,
    batch_size: int,
    *,
    where: Where | None = None,
    loader: LoaderFactory | str | None = None,
    current: LoaderSetting = LoaderSetting(),
    search: LoaderSearch = LoaderSearch(),
    on_progress: OnProgress | None = None,
    **shorthand: Unpack[DeviceShorthand],
) -> DataCheck:
    """Measure whether loading the data holds training back at ``batch_size``, and what fixes it.

    The batches come from ``loader(batch_size=..., num_workers=..., pin_memory=...,
    persistent_workers=..., prefetch_factor=...) -> DataLoader`` (a function, or its
    ``module:function`` spec), called with only the keywords its signature names (all of them
    with ``**kwargs``; only those are varied), or else from a DataLoader over the workload's
    map-style ``dataset`` (shuffled, ``drop_last=True``). ``current`` is the setting used now.
    Three passes time the loader alone, the step alone and the two together; when the loader is
    the bottleneck (more than ``WAIT_SHARE_THRESHOLD`` of the loop waits for data), settings are
    tried up to ``search.max_num_workers`` (default: the cores this process may use) and the
    cheapest within ``search.tolerance`` of the fastest is recommended. Each pass times at least
    ``search.window_seconds``; no setting is started after ``search.time_budget_seconds``. ``on_progress``
    hears each setting as it is measured, the current one first. The model, optimizer and RNG
    are left as they were. docs/check-data.md explains. ``where`` says where to measure (a
    ``batchfit.Where``; its device alone matters here), ``device`` its shorthand.
    """
    started = time.perf_counter()
    check_entry(
        "check_data", workload, on_progress, current=(current, LoaderSetting), search=(search, LoaderSearch)
    )
    check_positive_int("batch_size", batch_size)
    target = target_of("check_data", where, shorthand, DeviceShorthand.__optional_keys__).device
    if search.max_num_workers is None:
        search = replace(search, max_num_workers=usable_cores())
    factory = load_function(loader, "loader") if isinstance(loader, str) else loader
    source = LoaderSource(workload, batch_size, factory)
    source.check(current)
    check_model_on(workload.module, target.torch_device)
    return _Check(source, current, search, started, on_progress).run(target)


@dataclass(frozen=True)
class _Check:
    """One data check: the three passes at the current setting and, where the loader is the
    bottleneck, the settings tried, each told as it comes and none started after the time budget."""

    source: LoaderSource
    current: LoaderSetting
    search: LoaderSearch
    started: float
    on_progress: OnProgress | None

    def run(self, target: Device) -> DataCheck:
        batch_size, source, tolerance = self.source.batch_size, self.source, self.search.tolerance
        with DataLoop(source.workload, target, source, self.search.window_seconds) as loop:
            loader_rate = loop.loader_alone(self.current)
            step_rate = loop.step_alone()
            now, busy_share = loop.together(self.current)
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
            time.perf_counter() - self.started,
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
            out_of_time=self.out_of_time,
        )

    def out_of_time(self) -> bool:
        budget = self.search.time_budget_seconds
        return budget is not None and time.perf_counter() - self.started > budget

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

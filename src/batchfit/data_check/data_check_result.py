"""``DataCheck``: what ``check_data`` measured at a batch size, its verdict, every DataLoader setting
tried and the one recommended, and what the time budget left unmeasured."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, ClassVar

from batchfit.policy.explore.loader_settings import DataCheckStopReason, LoaderRecommendation, SettingRow
from batchfit.policy.explore.time_budget import NotMeasured
from batchfit.result import stamped


@dataclass(frozen=True)
class DataCheck:
    """The three measurements at ``batch_size``, the verdict, every setting tried, the advice, and
    the settings the time budget left out (``not_measured``, each with the seconds it would need)."""

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
    time_budget_seconds: float | None = None  # the whole check's (Timing.time_budget_seconds)
    not_measured: tuple[NotMeasured, ...] = ()

    def summary(self) -> str:
        wait = f"{self.data_wait_share:.0%} of each step waits for data (threshold {self.threshold:.0%})"
        if self.recommendation is None:
            return f"the loader is not the bottleneck at batch_size={self.batch_size}: {wait}."
        advice = self.recommendation.summary()
        if self.stop_reason == "time_budget":
            advice += f" ({self._out_of_time()})"
        return f"the loader is the bottleneck at batch_size={self.batch_size}: {wait}; {advice}"

    def _out_of_time(self) -> str:
        budget = "" if self.time_budget_seconds is None else f"={self.time_budget_seconds:g}"
        text = f"time_budget_seconds{budget} ran out after {len(self.settings)} setting(s) measured"
        if not self.not_measured:
            return text + "."
        needs = [left.needs_seconds for left in self.not_measured if left.needs_seconds is not None]
        more = f", about {math.ceil(sum(needs))} s more would measure them" if needs else ""
        return f"{text}; {len(self.not_measured)} not measured{more}."

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
            "time_budget_seconds": self.time_budget_seconds,
            "not_measured": [left.to_dict() for left in self.not_measured],
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
        lines += [left.line() for left in self.not_measured]
        lines.append(self.summary())
        return "\n".join(lines) + "\n"

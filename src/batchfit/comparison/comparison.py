"""What ``compare`` measured: a row per technique (its largest batch, memory and throughput, or why
it did not apply), against the baseline's, and the table and CSV they are read as."""

from __future__ import annotations

import csv
import io
import json
import statistics
from dataclasses import asdict, dataclass, replace
from typing import Any, ClassVar

from batchfit.policy.explore.ratios import Ratio, paired, ratio_text, within_noise
from batchfit.policy.explore.time_budget import NotMeasured
from batchfit.result import stamped
from batchfit.units import format_bytes


@dataclass(frozen=True)
class ComparisonRow:
    """One technique's measurements, or why it did not apply (``applied`` False, ``note`` the reason)."""

    technique: str  # "baseline", "amp", "amp+checkpointing", "accumulation", ...
    applied: bool
    note: str  # how it was applied ("autocast bfloat16"), or why not
    batch_size: int | None = None  # the largest memory-safe batch (accumulation: the micro-batch)
    peak_bytes: int | None = None
    bytes_per_sample: float | None = None  # the fitted memory line's slope (forward and backward)
    fixed_bytes: float | None = None  # and its intercept
    samples_per_second: float | None = None  # at batch_size (accumulation: the global batch's)
    recommended_batch_size: int | None = None  # explore's recommendation up to batch_size
    recommended_samples_per_second: float | None = None
    accumulation_steps: int | None = None
    batch_ratio: float | None = None  # batch_size over the baseline's
    throughput_ratio: float | None = None  # samples_per_second over the baseline's
    throughput_ratio_low: float | None = None  # its 90% interval (None: one reading, or the baseline)
    throughput_ratio_high: float | None = None
    at_max_batch_size: bool = False  # the search reached max_batch_size: batch_size is a lower bound
    trials: int = 0
    seconds: float = 0.0
    # One step's time over the baseline's at the same batch (None: not probed); a row at least
    # SLOW_STEP_RATIO times slower is ``slow``: reported at once, unsearched, its throughput ratio
    # the probe's.
    step_ratio: float | None = None
    slow: bool = False

    @property
    def within_noise(self) -> bool:
        """The throughput ratio's interval includes 1: the readings cannot tell it from no change."""
        return within_noise(self.throughput_ratio_low, self.throughput_ratio_high)

    def line(self) -> str:
        """What the row found, in a line."""
        if self.applied and self.batch_size is not None:
            return f"{self.technique}: batch_size={self.batch_size} ({self.note}) in {self.seconds:.1f} s"
        return f"{self.technique}: {self.note}"


@dataclass(frozen=True)
class Comparison:
    """Every technique's row, the baseline first, at one memory fraction on one device."""

    rows: tuple[ComparisonRow, ...]
    device: str
    memory_fraction: float
    budget_bytes: int | None
    unit: str  # of samples_per_second: "samples/s" or "tokens/s"
    global_batch_size: int | None
    seconds: float
    not_measured: tuple[NotMeasured, ...] = ()  # what the time budget left out, with its seconds
    seconds_per_reading: float | None = None  # seconds of stepping per timed window, warm-ups included

    command: ClassVar[str] = "compare"

    def to_dict(self) -> dict[str, Any]:
        return stamped(self.command, asdict(self))

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"

    def summary(self) -> str:
        """How many settings were compared, where, and the largest batch among them."""
        applied = [row for row in self.rows if row.applied and row.batch_size is not None]
        largest = max(applied, key=lambda row: row.batch_size or 0, default=None)
        best = (
            "" if largest is None else f"; the largest batch: {largest.batch_size} with {largest.technique}"
        )
        left_out = f"; {len(self.not_measured)} parts not measured" if self.not_measured else ""
        return f"compared {len(self.rows)} settings on {self.device} in {self.seconds:.1f} s{best}{left_out}."

    def to_csv(self) -> str:
        buffer = io.StringIO()
        fields = list(ComparisonRow.__dataclass_fields__)
        writer = csv.DictWriter(buffer, fieldnames=fields)
        writer.writeheader()
        for row in self.rows:
            writer.writerow(asdict(row))
        return buffer.getvalue()

    def table(self) -> str:
        header = (
            f"{'technique':<22} {'batch_size':>10} {'x batch':>7} {'peak':>11} {'per sample':>11} "
            f"{self.unit:>12} {'recommended':>11}  x speed [90% interval]"
        )
        lines = [header]
        for row in self.rows:
            if not row.applied or row.batch_size is None:
                lines.append(f"{row.technique:<22} {'-':>10}  {row.note}")
                continue
            batch = (">=" if row.at_max_batch_size else "") + f"{row.batch_size}"
            batch += f"x{row.accumulation_steps}" if row.accumulation_steps else ""
            recommended = "-" if row.recommended_batch_size is None else str(row.recommended_batch_size)
            lines.append(
                f"{row.technique:<22} {batch:>10} {_times(row.batch_ratio):>7} "
                f"{_bytes(row.peak_bytes):>11} {_bytes(row.bytes_per_sample):>11} "
                f"{_number(row.samples_per_second):>12} {recommended:>11}  {_speed(row)}"
            )
        if any(row.at_max_batch_size for row in self.rows):
            lines.append(">=: the search reached max_batch_size; the largest batch is at least that.")
        if any(row.within_noise for row in self.rows):
            lines.append(
                "within noise: the speed ratio's interval includes 1.00x; the readings cannot tell it "
                "from no change (more windows, --windows, narrow it)."
            )
        lines.append(f"on {self.device}, memory_fraction {self.memory_fraction:g}; how each applied:")
        lines.extend(f"  {row.technique}: {row.note}" for row in self.rows if row.batch_size is not None)
        if self.seconds_per_reading is not None:
            lines.append(f"speed rounds: {self.seconds_per_reading:.2f} s of stepping per reading.")
        lines.extend(part.line() for part in self.not_measured)
        return "\n".join(lines) + "\n"


def against(
    row: ComparisonRow,
    baseline: ComparisonRow,
    readings: list[float] | None,
    baseline_readings: list[float] | None,
) -> ComparisonRow:
    """The row with its throughput (the median of its readings) and its batch and throughput as
    multiples of the baseline's. The throughput ratio is the median of the ratios within each
    round (a round's readings are taken moments apart, so a slow spell divides out), with its 90%
    interval from those ratios (``policy.explore.ratios.paired``); the baseline's own row (``row`` is
    ``baseline``) is 1 by definition and has none."""
    if row.slow:  # its throughput ratio is the probe's, taken at the baseline's batch
        return row
    batch = None
    if not row.accumulation_steps and row.batch_size is not None and baseline.batch_size:
        batch = row.batch_size / baseline.batch_size
    speed = statistics.median(readings) if readings else None
    ratio = Ratio(1.0) if row is baseline and readings else None
    if readings and baseline_readings and row is not baseline:
        ratio = paired(readings, baseline_readings)
    return replace(
        row,
        samples_per_second=speed,
        batch_ratio=batch,
        throughput_ratio=None if ratio is None else ratio.value,
        throughput_ratio_low=None if ratio is None else ratio.low,
        throughput_ratio_high=None if ratio is None else ratio.high,
    )


def _speed(row: ComparisonRow) -> str:
    if row.throughput_ratio is None:
        return "-"
    return ratio_text(row.throughput_ratio, row.throughput_ratio_low, row.throughput_ratio_high)


def _times(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _bytes(value: float | None) -> str:
    return "-" if value is None else format_bytes(int(value))


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"

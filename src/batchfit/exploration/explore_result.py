"""What ``explore`` returns: the throughput measured at each batch size, the recommendation and how
it settled, what the time budget left unmeasured, and goodput given a noise scale, as a table, CSV
and JSON."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from typing import Any, ClassVar

from batchfit.policy.explore.choose import Recommendation
from batchfit.policy.explore.exploration import ExploreStopReason
from batchfit.policy.explore.settling import Unsettled
from batchfit.policy.explore.throughput import Point, estimates
from batchfit.policy.explore.time_budget import NotMeasured
from batchfit.policy.noise.goodput_result import Goodput
from batchfit.result import stamped


@dataclass(frozen=True)
class ExploreResult:
    """Every measured point (all its windows), the recommendation, and how it got there; under
    the confidence floor, ``unsettled`` says the recommendation is a leaning and what would settle
    it; given a noise scale, ``goodput`` predicts each batch to a target (None without one)."""

    points: tuple[Point, ...]
    recommendation: Recommendation
    history: tuple[Recommendation, ...]  # the live recommendation after each measurement
    max_batch_size: int  # the memory-safe bound explored up to
    unit: str  # "samples/s" or "tokens/s"
    stop_reason: ExploreStopReason
    explore_seconds: float
    device: str = ""  # the torch device timed, as "cpu" or "cuda:0"
    unsettled: Unsettled | None = None  # None when the recommendation is settled
    goodput: Goodput | None = None
    not_measured: tuple[NotMeasured, ...] = ()  # what the time budget left out, with the time it needs
    timing_seconds: float = 0.0  # of stepping: warm-ups, untimed steps and windows
    readings: int = 0  # timing windows read

    @property
    def seconds_per_reading(self) -> float | None:
        """explore's cost per reading: seconds of stepping per timed window, warm-ups and the
        untimed step before each revisit included (None before any window)."""
        return self.timing_seconds / self.readings if self.readings else None

    def estimates(self) -> dict[int, float]:
        """Each batch size's throughput with the rounds' drift divided out (what the rule compares)."""
        return estimates(self.points)

    command: ClassVar[str] = "explore"

    def to_dict(self) -> dict[str, Any]:
        corrected = self.estimates()
        data = {
            "points": [{**point.to_dict(), "estimate": corrected[point.batch_size]} for point in self.points],
            "recommendation": self.recommendation.to_dict(),
            "history": [entry.to_dict() for entry in self.history],
            "max_batch_size": self.max_batch_size,
            "unit": self.unit,
            "stop_reason": self.stop_reason,
            "explore_seconds": self.explore_seconds,
            "device": self.device,
            "unsettled": None if self.unsettled is None else self.unsettled.to_dict(),
            "goodput": None if self.goodput is None else self.goodput.to_dict(),
            "not_measured": [part.to_dict() for part in self.not_measured],
            "timing_seconds": self.timing_seconds,
            "readings": self.readings,
            "seconds_per_reading": self.seconds_per_reading,
        }
        return stamped(self.command, data)

    def summary(self) -> str:
        """The recommendation (or the leaning, and why it is not settled) and why the exploration stopped."""
        said = self.recommendation.line()
        if self.unsettled is not None:
            said += f"; {self.unsettled.line()}"
        if self.not_measured:
            parts = ", ".join(part.part for part in self.not_measured)
            said += f"; not measured: {parts} ({self.not_measured[0].reason})"
        return f"{said}; stopped ({self.stop_reason}) after {self.explore_seconds:.1f} s on {self.device}."

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"

    def to_csv(self) -> str:
        buffer = io.StringIO()
        writer = csv.writer(buffer)
        writer.writerow(["batch_size", f"estimate_{self.unit}", f"median_{self.unit}", "spread", "windows"])
        corrected = self.estimates()
        for point in self.points:
            writer.writerow(
                [
                    point.batch_size,
                    f"{corrected[point.batch_size]:.3f}",
                    f"{point.median:.3f}",
                    "" if point.spread is None else f"{point.spread:.4f}",
                    len(point.samples_per_second),
                ]
            )
        return buffer.getvalue()

    def table(self) -> str:
        corrected = self.estimates()
        lines = [f"{'batch_size':>10}  {self.unit:>12}  {'raw median':>12}  {'spread':>7}  {'windows':>7}"]
        chosen = "recommended" if self.unsettled is None else "leaning, not settled"
        for point in self.points:
            mark = f"  <- {chosen}" if point.batch_size == self.recommendation.batch_size else ""
            lines.append(
                f"{point.batch_size:>10}  {corrected[point.batch_size]:>12.1f}  {point.median:>12.1f}  "
                f"{_spread(point.spread):>7}  "
                f"{len(point.samples_per_second):>7}{mark}"
            )
        lines.append(self.recommendation.line())
        if self.unsettled is not None:
            lines.append(self.unsettled.line())
        lines.extend(part.line() for part in self.not_measured)
        if self.seconds_per_reading is not None:
            lines.append(
                f"{self.readings} readings in {self.timing_seconds:.1f} s of stepping: "
                f"{self.seconds_per_reading:.2f} s per reading, warm-ups and revisits included."
            )
        text = "\n".join(lines) + "\n"
        return text if self.goodput is None else f"{text}\n{self.goodput.table()}"


def _spread(spread: float | None) -> str:
    """A window spread as the table prints it: ``-`` for a single window, which has none."""
    return "-" if spread is None else f"{spread:.1%}"

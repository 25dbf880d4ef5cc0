"""explore's row: batchfit's pick judged against the sweep's truth (quality and time against their
targets), and the rows' table and summary as ``bench/explore.py`` prints them."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from _sweep import Sweep

QUALITY_TARGET = 0.97


TIME_TARGET = 0.40


@dataclass
class BatchfitRun:
    recommended: int
    best_batch_size: int  # the fastest batch batchfit measured
    confidence: int
    stop_reason: str
    measured: dict[int, list[float]]  # batch size -> its windows, in batchfit's own run
    rounds: dict[int, list[int]]  # batch size -> the round of each of those windows
    seconds: float
    cpu_seconds: float


@dataclass
class Row:
    example: str
    max_batch_size: int
    unit: str
    sweep: Sweep
    batchfit: BatchfitRun
    quality: float  # the truth at batchfit's recommendation / the truth's best
    time_ratio: float  # batchfit seconds / sweep seconds
    truth_pick: int  # the smallest sweep batch within 3% of the sweep's best
    truth_error: float  # relative standard error of the truth's level at its best
    half_quality: float  # the truth's own 3% pick from its odd windows, scored on its even ones
    quality_error: float  # the quality's relative standard error, from the truth's own windows
    sweep_pick: int  # the sweep's own 3% pick, from the plain medians of its counted windows
    sweep_pick_quality: float  # the truth at the sweep's own pick / the truth's best

    @property
    def quality_met(self) -> bool:
        return self.quality >= QUALITY_TARGET

    @property
    def time_met(self) -> bool:
        return self.time_ratio <= TIME_TARGET

    @property
    def no_larger(self) -> bool:
        """The rule's judgement: the pick is no larger than the truth's smallest within 3%."""
        return self.batchfit.recommended <= self.truth_pick

    def to_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "quality_met": self.quality_met,
            "time_met": self.time_met,
            "no_larger": self.no_larger,
            "sweep_best": self.sweep.best,
            "sweep_best_batch_size": self.sweep.best_batch_size,
        }


HEADERS = (
    "example",
    "max_batch_size",
    "unit",
    "sweep best (batch)",
    "sweep 3% pick",
    "truth +-",
    "truth self",
    "sweep's own pick",
    "bf pick",
    "bf conf",
    "bf stop",
    "quality",
    "quality +-",
    "bf s",
    "sweep s",
    "time ratio",
    "targets",
)


def table_rows(rows: list[Row]) -> list[list[str]]:
    lines = []
    for row in rows:
        targets = f"{'ok' if row.quality_met else 'MISS'}/{'ok' if row.time_met else 'MISS'}"
        lines.append(
            [
                row.example,
                str(row.max_batch_size),
                row.unit,
                f"{row.sweep.best:.0f} ({row.sweep.best_batch_size})",
                str(row.truth_pick),
                f"{row.truth_error:.1%}",
                f"{row.half_quality:.3f}",
                f"{row.sweep_pick} ({row.sweep_pick_quality:.3f})",
                str(row.batchfit.recommended),
                str(row.batchfit.confidence),
                row.batchfit.stop_reason,
                f"{row.quality:.3f}",
                f"{row.quality_error:.1%}",
                f"{row.batchfit.seconds:.1f}",
                f"{row.sweep.seconds:.1f}",
                f"{row.time_ratio:.3f}",
                targets,
            ]
        )
    return lines


def print_summary(rows: list[Row]) -> None:
    for row in rows:
        print(
            f"{row.example}: quality {row.quality:.3f} (target >= {QUALITY_TARGET}: "
            f"{'met' if row.quality_met else 'NOT met'}), time ratio {row.time_ratio:.3f} "
            f"(target <= {TIME_TARGET}: {'met' if row.time_met else 'NOT met'}), pick "
            f"{row.batchfit.recommended} {'no larger than' if row.no_larger else 'LARGER than'} the "
            f"rule's {row.truth_pick}"
        )
    met_quality, met_time = sum(row.quality_met for row in rows), sum(row.time_met for row in rows)
    print(f"quality target (>= {QUALITY_TARGET}) met in {met_quality}/{len(rows)} examples")
    print(f"time target (<= {TIME_TARGET}) met in {met_time}/{len(rows)} examples")
    print(f"pick no larger than the rule's in {sum(row.no_larger for row in rows)}/{len(rows)} examples")

"""A prediction of ``bench/predict.py`` judged at one target cap: each method's answer against the true
largest batch there (its error in samples and per cent, within the target share or not, and whether the
truth lies in the prediction's band), and the target's line."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from _truth import Curve

from batchfit.policy.capacity.capacity_prediction import CapacityPrediction


@dataclass
class Judged:
    """One method's answer under one target cap, judged on the truth there."""

    answer: int | None
    band: tuple[int | None, int | None] | None  # the prediction's; None for MemTracker
    error_samples: int | None
    error_percent: float | None
    allowed_samples: float | None
    within: bool | None
    truth_in_band: bool | None = None  # None: no band (MemTracker), or no truth or no lower end


@dataclass
class TargetRow:
    mode: str
    cap: str
    cap_bytes: int
    truth: dict[str, Any]  # the curve (``Curve.to_dict``)
    true_largest: int | None  # the largest size below the first that failed
    predicted: Judged
    cpu_alone: Judged | None
    memtracker: Judged | None
    memtracker_peaks: dict[int, int] = field(default_factory=dict)


def true_largest(curve: Curve) -> int | None:
    """The largest probed size that fitted below the first that failed (the largest fitting where
    none failed): what a prediction answers, the largest size below the first that is not placed."""
    first = min((b for b, fit in curve.fits.items() if not fit), default=None)
    below = [b for b, fit in curve.fits.items() if fit and (first is None or b < first)]
    return max(below, default=None)


def judged(
    answer: int | None, truth: int | None, share: float, band: tuple[int | None, int | None] | None = None
) -> Judged:
    inside = None
    if band is not None and truth is not None and band[0] is not None:
        inside = band[0] <= truth and (band[1] is None or truth <= band[1])
    if answer is None or truth is None:
        return Judged(answer, band, None, None, None, None, inside)
    allowed = max(1.0, share * truth)
    error = answer - truth
    return Judged(answer, band, error, 100 * error / truth, allowed, abs(error) <= allowed, inside)


def pairs(said: CapacityPrediction | None) -> list[list[int]]:
    return [list(pair) for pair in said.pairs] if said is not None else []


def describe(row: TargetRow) -> str:
    """A target's line: the truth, the prediction and its band, MemTracker's, each error."""
    curve = Curve.from_dict(row.truth)

    def said(name: str, judged: Judged | None) -> str:
        if judged is None:
            return ""
        error = (
            ""
            if judged.error_samples is None
            else f" ({judged.error_samples:+d}, {judged.error_percent:+.1f}%)"
        )
        band = f" band {judged.band[0]}-{judged.band[1]}" if judged.band else ""
        inside = {True: ", truth in band", False: ", truth outside band", None: ""}[judged.truth_in_band]
        return f"; {name} {judged.answer}{band}{error}{' within' if judged.within else ''}{inside}"

    return (
        f"truth {row.true_largest} ({curve.describe()})"
        + said("predicted", row.predicted)
        + said("from the CPU alone", row.cpu_alone)
        + said("MemTracker", row.memtracker)
    )

"""The strict readings of an answer on a truth, asked apart where the weak verdict (``_truth.Verdict``:
the answer fits, the size above it fails, it trains) folds them into one. Torch-free.

- ``largest``: the answer is the largest size that fits ``TRUTH_STEPS`` steps among the sizes the
  truth probed up to the method's bound;
- ``none_below_fails``: no size the truth probed below the answer fails;
- ``trains``: the answer trains ``CHECK_STEPS`` steps.

Each is True, False or None (not measured). A "no" stands on any probed size. A "yes" of the first
two needs a scan (``_truth.scan`` with a window): a bisection from the answer, or a boundary check
(``--window 0``), probes only the size above an answer that fits, which is the weak check again.
The one "yes" a bisection gives: an answer at the method's bound that fits has nothing above it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from _truth import spans


@dataclass(frozen=True)
class Readings:
    """One answer read three ways, with the probed sizes each reading rests on."""

    answer: int
    largest: bool | None
    none_below_fails: bool | None
    trains: bool | None
    above: str  # the probed sizes above the answer up to the bound, as spans ("157-175")
    below: str  # the probed sizes below the answer
    fitting_above: str  # those above that fit: why ``largest`` is False
    failing_below: str  # those below that fail: why ``none_below_fails`` is False

    @property
    def strict(self) -> bool | None:
        """All three read yes (True), one reads no (False), or none reads no and one is not measured."""
        found = (self.largest, self.none_below_fails, self.trains)
        return False if False in found else None if None in found else True

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"strict": self.strict}


def probed(truth: dict[str, Any], start: int | None = None) -> tuple[dict[int, bool], str]:
    """A recorded truth's verdict (fits ``TRUTH_STEPS`` steps) at each size it probed, and its kind
    (``scan`` or ``bisection``). A bisection (``true_max``) records the sizes that fit (``peaks``)
    and its ``first_failure`` (probed where it is at most ``upper``); ``start``, the answer it
    bisected from (batchfit's), was probed first, so it failed where it is not among the fitting."""
    if "fits" in truth:
        return {int(size): fit for size, fit in truth["fits"].items()}, "scan"
    points = {int(size): True for size in truth.get("peaks", {})}
    if truth["true_max"] is not None:
        points[int(truth["true_max"])] = True
    failure = truth["first_failure"]
    if failure is not None and failure <= truth["upper"]:
        points[int(failure)] = False
    if start is not None and start not in points:
        points[start] = False
    return points, "bisection"


def read(
    points: dict[int, bool], answer: int, bound: int | None, trains: bool | None, scanned: bool
) -> Readings:
    """``answer`` read on ``points`` (size -> fits), ``bound``: the largest size the method may
    answer (None: none); ``scanned``: the points are a scan's, which can read yes."""
    above = sorted(size for size in points if size > answer and (bound is None or size <= bound))
    below = sorted(size for size in points if size < answer)
    fitting_above = [size for size in above if points[size]]
    failing_below = [size for size in below if not points[size]]
    fits = points.get(answer)
    largest: bool | None = None
    if fits is False or fitting_above:
        largest = False
    elif fits and (answer == bound or (scanned and above)):
        largest = True
    none_below: bool | None = False if failing_below else True if scanned and below else None
    return Readings(
        answer,
        largest,
        none_below,
        trains,
        spans(above),
        spans(below),
        spans(fitting_above),
        spans(failing_below),
    )


def read_row(row: dict[str, Any], method: str, bound: int | None, window: float) -> Readings | None:
    """A method's answer in a results file's find row (``bench/find.py``'s ``row_dict``), read on the
    row's truth; ``window``: the scan's half-width the file records (0: a boundary check). None where
    the method did not run or gave no answer."""
    result = row["batchfit"] if method == "batchfit" else row["competitors"].get(method)
    if result is None or result["answer"] is None:
        return None
    answer = int(result["answer"])
    points, kind = probed(row["truth"], start=answer if method == "batchfit" else None)
    trains = row["truth"]["trains"].get(str(answer)) if kind == "scan" else result.get("trains")
    return read(points, answer, bound, trains, scanned=kind == "scan" and window > 0)


def said(flag: bool | None) -> str:
    """A reading as a table cell: yes, no, or - (not measured)."""
    return "-" if flag is None else "yes" if flag else "no"


def cell(readings: Readings) -> str:
    """The three readings in a cell: ``yes / no: 141-144, 149-152 / yes``."""
    largest = said(readings.largest) + (f": {readings.fitting_above} fit" if readings.fitting_above else "")
    if readings.largest is False and not readings.fitting_above:
        largest += ": it fails"
    below = said(readings.none_below_fails)
    below += f": {readings.failing_below} fail" if readings.failing_below else ""
    return f"{largest} / {below} / {said(readings.trains)}"

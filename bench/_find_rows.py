"""A row of ``bench/find.py``: every method's answer on one case, judged on the truth (the weak verdict
and the strict readings), the summary printed over the rows, and the row as the results file holds it."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from _capped import CPU_CACHING, MAX_BATCH_SIZE, Case, MethodResult
from _peers import COMPETITORS
from _readings import Readings, cell, read
from _truth import CHECK_STEPS, WINDOW, Curve, Verdict, judge

#: The largest answer each method may give: batchfit's max_batch_size and accelerate's start;
#: Lightning's binsearch has none.
BOUNDS: dict[str, int | None] = {"batchfit": MAX_BATCH_SIZE, "accelerate": MAX_BATCH_SIZE, "lightning": None}


@dataclass
class Row:
    case: Case
    cap_bytes: int
    truth: Curve
    batchfit: MethodResult
    competitors: dict[str, MethodResult | None]  # None: the tool is not installed
    # The GPU's live bytes before the methods and after each, in the order they ran (CUDA only).
    live_bytes: dict[str, int] = field(default_factory=dict)

    def verdict(self, method: str) -> Verdict | None:
        """A method's answer judged on the truth's curve, within the method's own bound."""
        result = self.batchfit if method == "batchfit" else self.competitors.get(method)
        if result is None or result.answer is None:
            return None
        return judge(self.truth, result.answer, BOUNDS.get(method))

    def readings(self, method: str, window: float = WINDOW) -> Readings | None:
        """A method's answer read strictly (``_readings``): the largest fitting size probed up to
        its bound, no failure probed below it, and its CHECK_STEPS-step check, each apart."""
        result = self.batchfit if method == "batchfit" else self.competitors.get(method)
        if result is None or result.answer is None:
            return None
        trains = self.truth.trains.get(result.answer)
        return read(self.truth.fits, result.answer, BOUNDS.get(method), trains, scanned=window > 0)


#: Lightning's trials and time over batchfit's, at least, in every row: 3 on the CPU (where the
#: fake-tensor forecast places the real trials), 2 on CUDA and its model (every trial is real).
LIGHTNING_TARGET = {"cpu": 3.0, "cuda": 2.0, CPU_CACHING: 2.0}


def print_summary(rows: list[Row], device: str, window: float = WINDOW) -> None:
    """How often each method was exact (the weak check: the answer fits, the size above it fails, it
    trains), each strict reading apart, and Lightning's trials and time over batchfit's."""
    for name in ("batchfit", *COMPETITORS):
        judged = [(row, verdict) for row in rows if (verdict := row.verdict(name)) is not None]
        if not judged:
            continue
        exact = sum(verdict.exact for _, verdict in judged)
        trained = sum(bool(verdict.trains) for _, verdict in judged)
        print(f"{name}: exact {exact}/{len(judged)}; its answer trained {CHECK_STEPS} steps: {trained}")
        strict = [(row, found) for row, _ in judged if (found := row.readings(name, window)) is not None]
        for reading, said in (("largest", "the largest fitting size probed up to its bound"),
                              ("none_below_fails", "no failure probed below it")):  # fmt: skip
            values = [getattr(found, reading) for _, found in strict]
            print(
                f"  strictly, {said}: {values.count(True)}/{len(strict)} (not measured: {values.count(None)})"
            )
        for row, found in strict:
            if found.strict is not True:
                print(f"  NOT STRICT: {row.case.name} at {row.case.cap}: {found.answer}: {cell(found)}")
        for row, verdict in judged:
            if not verdict.exact:
                print(
                    f"  NOT EXACT: {row.case.name} at {row.case.cap}: {verdict.answer}, judged against "
                    f"{verdict.reference}; trains {CHECK_STEPS} steps: {verdict.trains}"
                )
        if name == "batchfit":
            continue
        ran = [(row, row.competitors[name]) for row, _ in judged]
        trials = [r.trials / row.batchfit.trials for row, r in ran if r is not None]
        seconds = [r.seconds / row.batchfit.seconds for row, r in ran if r is not None]
        cpu = [r.cpu_seconds / row.batchfit.cpu_seconds for row, r in ran if r is not None]
        print(f"  as multiples of batchfit's: trials {_spread(trials)}, seconds {_spread(seconds)}, ", end="")
        print(f"CPU seconds {_spread(cpu)}")
        if name == "lightning":
            target = LIGHTNING_TARGET[device]
            met = all(ratio >= target for ratio in trials + seconds)
            print(f"  target, at most 1/{target:g} of Lightning's trials and time in every row:", end=" ")
            print("met" if met else "NOT met")


def _spread(ratios: list[float]) -> str:
    if not ratios:
        return "-"
    return f"{min(ratios):.1f}..{max(ratios):.1f} (geometric mean {statistics.geometric_mean(ratios):.1f})"


def row_dict(row: Row, window: float = WINDOW) -> dict[str, Any]:
    """A row as the results file holds it: the curve, every method's search, its verdict and its
    strict readings."""
    verdicts = {
        name: asdict(verdict) | {"exact": verdict.exact}
        for name in ("batchfit", *COMPETITORS)
        if (verdict := row.verdict(name)) is not None
    }
    readings = {
        name: found.to_dict() for name in ("batchfit", *COMPETITORS) if (found := row.readings(name, window))
    }
    return asdict(row) | {"truth": row.truth.to_dict(), "verdicts": verdicts, "readings": readings}

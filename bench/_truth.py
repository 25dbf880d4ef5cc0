"""The truth the exactness benchmarks judge answers by (``find.py``, ``compare.py``): which batch
sizes train ``TRUTH_STEPS`` steps under the cap, scanned around an answer, and the verdict on each
method's answer. Torch-free: a probe is any ``(batch_size, steps) -> fits`` callable.

The scan takes every size within ``WINDOW`` of the answer, each method's answer and the size above
it, and the answers' ``CHECK_STEPS``-step checks, in one seeded shuffle (no method's sizes run
first or last, so what the process comes to hold over the run, cuBLAS's and cuDNN's workspaces,
weighs on every size alike). Where the window's top still fits, it goes on up, a block of
``WINDOW`` at a time, each block scanned whole and shuffled, until a size above the answer fails:
the true boundary, not a fixed ceiling. Where nothing at or below the answer fits, it goes down
the same way. Nothing assumes that fitting is monotone in the batch: the curve says where it is not.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import Any

#: Steps in a probe of the truth: what the answer must train, as a caching allocator's state
#: settles over the first steps (batchfit's own confirming trials run as many).
TRUTH_STEPS = 10
#: Steps the answer itself must train besides.
CHECK_STEPS = 20
#: The scan's half-width around the answer, as a share of it (at least), and the size of each
#: block it goes on by.
WINDOW = 0.12
#: The shuffle's seed: a rerun probes in the same order.
SEED = 0
#: How far the scan goes on up at most, as a multiple of the answer: a workload that fits far past
#: its answer is reported as fitting to there.
REACH = 4
MIN_REACH = 64

#: ``probe(batch_size, steps)``: whether ``steps`` training steps of ``batch_size`` complete under
#: the cap, from the model as built (weights, no optimizer state, GradScalers unstepped, the cache
#: emptied).
Probe = Callable[[int, int], bool]


@dataclass
class Curve:
    """Which sizes trained ``TRUTH_STEPS`` steps (``fits``) and which answers trained
    ``CHECK_STEPS`` (``trains``), with every probe in the order it ran."""

    fits: dict[int, bool] = field(default_factory=dict)
    trains: dict[int, bool] = field(default_factory=dict)
    order: list[tuple[int, int]] = field(default_factory=list)  # (batch size, steps), as run
    seconds: float = 0.0
    reach: int | None = None  # the largest size the scan may probe; None: no limit was reached

    def first_failure_above(self, size: int) -> int | None:
        """The smallest probed size above ``size`` that did not fit, or None."""
        return min((b for b, fit in self.fits.items() if b > size and not fit), default=None)

    def reference(self, answer: int, bound: int | None = None) -> int | None:
        """What ``answer`` is judged against: the largest fitting size at or below the first
        failure above it (and at most ``bound``, the method's own upper limit). Where fitting is
        monotone, that is the largest size that fits."""
        ceiling = self.first_failure_above(answer)
        sizes = [
            b
            for b, fit in self.fits.items()
            if fit and (ceiling is None or b <= ceiling) and (bound is None or b <= bound)
        ]
        return max(sizes, default=None)

    @property
    def largest_fitting(self) -> int | None:
        return max((b for b, fit in self.fits.items() if fit), default=None)

    @property
    def fitting_above_a_failure(self) -> list[int]:
        """The fitting sizes above the first failure: empty where the curve is monotone."""
        first = min((b for b, fit in self.fits.items() if not fit), default=None)
        return sorted(b for b, fit in self.fits.items() if fit and first is not None and b > first)

    @property
    def monotone(self) -> bool:
        return not self.fitting_above_a_failure

    def describe(self) -> str:
        """The curve in a line: ``fits 109-155, 160; fails 156-159, 161-174``."""
        fitting = [b for b, fit in sorted(self.fits.items()) if fit]
        failing = [b for b, fit in sorted(self.fits.items()) if not fit]
        parts = []
        if fitting:
            parts.append(f"fits {spans(fitting)}")
        if failing:
            parts.append(f"fails {spans(failing)}")
        return "; ".join(parts) or "nothing probed"

    def to_dict(self) -> dict[str, Any]:
        return {
            "fits": {str(b): fit for b, fit in sorted(self.fits.items())},
            "trains": {str(b): fit for b, fit in sorted(self.trains.items())},
            "order": self.order,
            "seconds": self.seconds,
            "reach": self.reach,
            "monotone": self.monotone,
            "described": self.describe(),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Curve:
        return cls(
            {int(b): fit for b, fit in data["fits"].items()},
            {int(b): fit for b, fit in data["trains"].items()},
            [tuple(pair) for pair in data["order"]],  # type: ignore[misc]
            data["seconds"],
            data.get("reach"),
        )


@dataclass(frozen=True)
class Verdict:
    """One method's answer judged on the curve."""

    answer: int | None
    reference: int | None  # the largest fitting size at or below the first failure above it
    trains: bool | None  # the answer trained CHECK_STEPS steps (None: not checked)

    @property
    def exact(self) -> bool:
        return self.answer is not None and self.answer == self.reference and self.trains is True


def judge(curve: Curve, answer: int | None, bound: int | None = None) -> Verdict:
    """``answer`` against ``curve``; ``bound``: the largest size the method may answer."""
    if answer is None:
        return Verdict(None, None, None)
    return Verdict(answer, curve.reference(answer, bound), curve.trains.get(answer))


def spans(sizes: Iterable[int]) -> str:
    """Sorted sizes as runs: ``1-4, 7, 9-10``."""
    runs: list[list[int]] = []
    for size in sorted(sizes):
        if runs and size == runs[-1][1] + 1:
            runs[-1][1] = size
        else:
            runs.append([size, size])
    return ", ".join(str(low) if low == high else f"{low}-{high}" for low, high in runs)


def settings(width: float = WINDOW) -> dict[str, Any]:
    """The truth's settings, for a results file (``width``: the scan's, as ``scan`` took it)."""
    return {
        "steps": TRUTH_STEPS,
        "check_steps": CHECK_STEPS,
        "window": width,
        "seed": SEED,
        "reach": REACH,
        "order": "after every method: one seeded shuffle of the window's sizes, each answer and the "
        "size above it, and the answers' checks; then blocks further out, each shuffled",
    }


def window(answer: int, width: float = WINDOW) -> tuple[int, int]:
    """The sizes within ``width`` of ``answer`` (and at least the one above it)."""
    return max(1, math.floor(answer * (1 - width))), max(answer + 1, math.ceil(answer * (1 + width)))


def scan(
    probe: Probe,
    answer: int,
    others: Collection[int] = (),
    *,
    seed: int = SEED,
    reach: int | None = None,
    width: float = WINDOW,
) -> Curve:
    """The curve around ``answer`` (the principal method's), judging ``others`` (the other methods'
    answers) too: see the module's docstring. ``reach``: the largest size probed (default
    ``REACH`` x the largest answer). ``width``: the window's half-width; 0 probes the answers and
    the sizes above them alone (then one size a step on up or down), a boundary check that sees
    no failure below an answer, for a run that cannot afford the scan."""
    curve = Curve()
    shuffle = random.Random(seed).shuffle
    answers = sorted({answer, *others})
    top = reach if reach is not None else max(REACH * max(answers), MIN_REACH)
    began = time.perf_counter()

    def run(sizes: Iterable[int], checks: Iterable[int] = ()) -> None:
        todo = [(b, TRUTH_STEPS) for b in sorted(set(sizes)) if 1 <= b <= top and b not in curve.fits]
        todo += [(b, CHECK_STEPS) for b in sorted(set(checks)) if b not in curve.trains]
        shuffle(todo)
        for batch_size, steps in todo:
            fit = probe(batch_size, steps)
            (curve.fits if steps == TRUTH_STEPS else curve.trains)[batch_size] = fit
            curve.order.append((batch_size, steps))

    low, high = window(answer, width)
    run([*range(low, high + 1), *(b for a in answers for b in (a, a + 1))], answers)
    while curve.first_failure_above(answer) is None and high < top:  # on up, to the boundary
        high, previous = min(top, max(high + 1, math.ceil(high * (1 + width)))), high
        run(range(previous + 1, high + 1))
    while low > 1 and not any(fit for b, fit in curve.fits.items() if b <= answer):  # down
        low, previous = max(1, min(low - 1, math.floor(low * (1 - width)))), low
        run(range(low, previous))
    if curve.first_failure_above(answer) is None:
        curve.reach = top
    curve.seconds = time.perf_counter() - began
    return curve

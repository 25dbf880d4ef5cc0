"""The replay's model of a machine: a recorded curve (its truth, its drift, its residuals) and the
``Meter`` that draws explore's windows from it on a modelled clock (``bench/explore_replay.py``)."""

from __future__ import annotations

import bisect
import math
import random
from dataclasses import dataclass
from typing import Any

# bench/ is the script's directory, so on sys.path.
from _sweep import RULE_TOLERANCE, STEPS_PER_WINDOW, SWEEP_WINDOWS, polish, table_of

from batchfit.runtime.devices.cuda import WINDOW_STEPS
from batchfit.runtime.steps.timer import MIN_WINDOW_SECONDS

TOKENS = {"transformer": 128}  # tokens per sample of the built-in examples that count tokens
#: A size the truth did not measure is off the line between its neighbours by this much (a
#: standard deviation of logarithms, fixed per size): kernels tile unevenly, and a line would
#: flatter an exploration that leans on one.
UNMEASURED_BUMP = 0.02
#: The chooser's work between two rounds (its bootstraps), in modelled seconds: fixed so that the
#: replay does not depend on the load.
ROUND_OVERHEAD_SECONDS = 0.005
#: The passes of the interleaved sweep explore's time is set against.
INTERLEAVED_PASSES = 3


@dataclass
class Curve:
    """One recorded example: its truth, its drift and its residuals."""

    name: str
    max_batch_size: int
    tokens: int
    sizes: list[int]  # the sweep's sizes, ascending
    level: dict[int, float]  # log-throughput (per second) at each recorded size
    residuals: dict[int, list[float]]  # each recorded size's window residuals about the fit
    drift: list[float]  # the recorded passes' common factors (log), in the order they ran
    pass_seconds: float  # how long one of those passes took (modelled)
    unmeasured_bump: float = UNMEASURED_BUMP  # how far an unrecorded size is off the line
    min_window_steps: int = 1  # the recording device's shortest window (CUDA's: WINDOW_STEPS)
    device: str = "cpu"  # where it was recorded

    @classmethod
    def from_row(cls, row: dict[str, Any], source: str, device: str = "cpu") -> Curve:
        everything = {**row["sweep"]["points"], **row["sweep"].get("extra", {})}
        rates = {int(b): p["windows"] for b, p in everything.items()}
        passes = {int(b): p["passes"] for b, p in everything.items()}
        table = table_of(rates, passes)
        level, effect = polish(table)
        residuals = {
            batch: [value - level[batch] - effect[p] for p, value in row_.items()]
            for batch, row_ in table.items()
        }
        tokens = TOKENS.get(row["example"], 1)
        # The drift: the common factors of the passes over every size (the first ones), in turn.
        full = sorted(p for p in effect if all(p in table[int(b)] for b in row["sweep"]["points"]))
        pass_seconds = sum(
            (1 + STEPS_PER_WINDOW) * int(b) * tokens / math.exp(level[int(b)]) for b in row["sweep"]["points"]
        )
        return cls(
            f"{row['example']}@{source}",
            row["max_batch_size"],
            tokens,
            sorted(int(b) for b in row["sweep"]["points"]),
            level,
            residuals,
            [effect[p] for p in full],
            pass_seconds,
            min_window_steps=WINDOW_STEPS if device.startswith("cuda") else 1,
            device=device,
        )

    def log_rate(self, batch: int) -> float:
        if batch in self.level:
            return self.level[batch]
        known = sorted(self.level)
        index = bisect.bisect_left(known, batch)
        low, high = known[max(index - 1, 0)], known[min(index, len(known) - 1)]
        if low == high:
            return self.level[low]
        share = math.log(batch / low) / math.log(high / low)
        bump = random.Random(f"{self.name}:{batch}").gauss(0, self.unmeasured_bump)
        return self.level[low] + share * (self.level[high] - self.level[low]) + bump

    def step_seconds(self, batch: int) -> float:
        return batch * self.tokens / math.exp(self.log_rate(batch))

    def residual_pool(self, batch: int) -> list[float]:
        if batch in self.residuals:
            return self.residuals[batch]
        return self.residuals[min(self.residuals, key=lambda b: abs(math.log(b / batch)))]

    @property
    def best(self) -> float:
        return max(self.level[b] for b in self.sizes)

    @property
    def rule_pick(self) -> int:
        """The truth's smallest sweep size within 3% of its best (``bench/explore.py``'s truth_pick)."""
        return min(b for b in self.sizes if self.level[b] >= self.best + math.log(1 - RULE_TOLERANCE))

    def interleaved_seconds(self) -> float:
        """Three passes of an interleaved sweep over the sweep's sizes: each pass gives every size
        one untimed step (the first after another shape) and one window of the sweep's steps."""
        return sum(self.step_seconds(b) * INTERLEAVED_PASSES * (1 + STEPS_PER_WINDOW) for b in self.sizes)

    def sweep_seconds(self) -> float:
        windows = 1 + SWEEP_WINDOWS  # the discarded window and the counted ones
        return sum(self.step_seconds(b) * (1 + windows * STEPS_PER_WINDOW) for b in self.sizes)


class ModelMeter:
    """Explore's ``Meter`` on a model of the machine: windows drawn from a curve, and a clock that
    counts the modelled seconds of the steps and of the chooser's rounds, nothing real."""

    def __init__(
        self, curve: Curve, rng: random.Random, round_overhead_seconds: float = ROUND_OVERHEAD_SECONDS
    ) -> None:
        self.curve, self.rng, self.round_overhead_seconds = curve, rng, round_overhead_seconds
        self.clock = 0.0
        self.steps: dict[int, int] = {}
        self.phase = rng.uniform(0, len(curve.drift) * curve.pass_seconds)

    def now(self) -> float:
        return self.clock

    def _drift_now(self) -> float:
        """The recorded passes' common factors played back in turn, from a random one on."""
        index = int((self.clock + self.phase) / self.curve.pass_seconds)
        return self.curve.drift[index % len(self.curve.drift)]

    def first_visit(self, batch_size: int) -> None:
        step = self.curve.step_seconds(batch_size)
        steps = max(self.curve.min_window_steps, math.ceil(MIN_WINDOW_SECONDS / step))
        self.clock += step * (1 + self.curve.min_window_steps)  # the warm-up step and the first window
        self.steps[batch_size] = steps

    def revisit(self, batch_size: int) -> None:
        self.clock += self.curve.step_seconds(batch_size)

    def window(self, batch_size: int) -> float:
        steps = self.steps[batch_size]
        scale = math.sqrt(STEPS_PER_WINDOW / steps)
        log_rate = (
            self.curve.log_rate(batch_size)
            + self._drift_now()
            + scale * self.rng.choice(self.curve.residual_pool(batch_size))
        )
        rate = math.exp(log_rate)
        self.clock += steps * batch_size * self.curve.tokens / rate
        return rate  # per second, in the curve's unit (tokens for the transformer)

    def end_round(self) -> None:  # once a round, when the chooser runs
        self.clock += self.round_overhead_seconds

"""Replay explore's policy on throughput curves recorded by ``bench/explore.py`` (a tuning aid).

It runs ``batchfit.policy.explore.exploration.explore_rounds`` (its rounds, its chooser, its stopping
rules) hundreds of times against a model of the measurements built from a recorded run's truth,
on a modelled clock, and tallies per example the quality and the time over the modelled sweep's.
The same seed gives the same replay on any machine. It is a model, not the benchmark: compare
variants of the rules (``--set``) on the same curves, and confirm with the benchmark itself.

Run: ``.venv/bin/python bench/explore_replay.py bench/results/explore.json [more.json ...]
[--replays 200] [--set focus_time_factor=2 ...]`` (about 10 s per 100 replays of an example).
"""

from __future__ import annotations

import argparse
import bisect
import dataclasses
import json
import math
import random
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _explore_rows import QUALITY_TARGET, TIME_TARGET

# bench/ is the script's directory, so on sys.path.
from _sweep import RULE_TOLERANCE, STEPS_PER_WINDOW, SWEEP_WINDOWS, polish, table_of

from batchfit.errors import ConfigurationError
from batchfit.policy.explore.exploration import Rules, explore_rounds
from batchfit.policy.plan.micro_batch import micro_batch_sizes
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
#: The shortest window explore times, as the real meter's default.


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


@dataclass
class Replay:
    pick: int
    quality: float
    time_ratio: float
    stop_reason: str
    confidence: int


def replay(curve: Curve, seed: int, rules: Rules | None = None) -> Replay:
    """One exploration of ``curve`` by explore's policy under ``rules`` (default: explore's), the
    model's windows drawn from ``seed``: its pick, scored on the curve's truth, and its time over
    the modelled sweep's."""
    meter = ModelMeter(curve, random.Random(seed))
    exploration = explore_rounds(micro_batch_sizes(1, curve.max_batch_size), meter, rules or Rules())
    pick = exploration.recommendation.batch_size
    return Replay(
        pick,
        math.exp(curve.log_rate(pick) - curve.best),
        exploration.seconds / curve.sweep_seconds(),
        exploration.stop_reason,
        exploration.recommendation.confidence,
    )


def summarise(curve: Curve, replays: list[Replay]) -> str:
    qualities = sorted(r.quality for r in replays)
    times = sorted(r.time_ratio for r in replays)
    met = sum(r.quality >= QUALITY_TARGET for r in replays) / len(replays)
    both = sum(r.quality >= QUALITY_TARGET and r.time_ratio <= TIME_TARGET for r in replays) / len(replays)
    no_larger = sum(r.pick <= curve.rule_pick for r in replays) / len(replays)
    picks: dict[int, int] = {}
    for r in replays:
        picks[r.pick] = picks.get(r.pick, 0) + 1
    common = ", ".join(f"{b}:{n}" for b, n in sorted(picks.items(), key=lambda item: -item[1])[:5])
    misses: dict[str, list[int]] = {}
    for r in replays:
        if r.quality < QUALITY_TARGET:
            misses.setdefault(r.stop_reason, []).append(r.confidence)
    missed = "; ".join(
        f"{reason} {len(c)} (confidence median {statistics.median(c):.0f})"
        for reason, c in sorted(misses.items())
    )
    return (
        f"{curve.name:<24} quality>={QUALITY_TARGET} {met:>5.0%}  both {both:>5.0%}  "
        f"quality p10 {qualities[len(qualities) // 10]:.3f}  time median {statistics.median(times):.2f} "
        f"p90 {times[9 * len(times) // 10]:.2f}  picks {common}\n{'':<26}no larger than the rule's "
        f"{curve.rule_pick} in {no_larger:.0%}; misses: {missed or 'none'}"
    )


def with_setting(rules: Rules, assignment: str) -> Rules:
    """``rules`` with one field set from ``NAME=VALUE`` (``none`` for a field that may be None)."""
    name, _, text = assignment.partition("=")
    fields = {field.name for field in dataclasses.fields(Rules)}
    if name not in fields:
        raise ValueError(f"Rules has no field {name!r}; choose from {', '.join(sorted(fields))}")
    default = getattr(Rules(), name)
    value: Any
    if text.lower() == "none":
        value = None
    elif isinstance(default, str):
        value = text
    elif isinstance(default, int) or (default is None and text.isdigit()):
        value = int(text)
    else:
        value = float(text)
    changed = dataclasses.replace(rules, **{name: value})
    changed.check()
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("runs", nargs="+", type=Path, help="results files of bench/explore.py")
    parser.add_argument("--replays", type=int, default=200)
    parser.add_argument("--examples", default="mlp,cnn,transformer")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="set a field of explore's Rules for a what-if, e.g. focus_time_factor=2",
    )
    args = parser.parse_args(argv)
    rules = Rules()
    for assignment in args.set:
        try:
            rules = with_setting(rules, assignment)
        except (ValueError, ConfigurationError) as error:
            parser.error(f"--set {assignment}: {error}")
    curves = [
        Curve.from_row(row, path.stem, str(results.get("device", "cpu")))
        for path in args.runs
        for results in [json.loads(path.read_text())]
        for row in results["rows"]
        if row["example"] in args.examples.split(",")
        and "passes" in next(iter(row["sweep"]["points"].values()))
    ]
    total_met = total = 0
    for curve in curves:
        print(
            f"{curve.name}: {len(curve.drift)} passes of drift ({curve.pass_seconds:.2f} s each, sd "
            f"{statistics.pstdev(curve.drift):.3f}), "
            f"sweep {curve.sweep_seconds():.1f} s (modelled)",
            flush=True,
        )
        replays = [replay(curve, seed, rules) for seed in range(args.replays)]
        print(summarise(curve, replays), flush=True)
        total_met += sum(r.quality >= QUALITY_TARGET and r.time_ratio <= TIME_TARGET for r in replays)
        total += len(replays)
    print(f"all: both targets met in {total_met / total:.1%} of {total} replays")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

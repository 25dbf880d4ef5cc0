"""Replay ``batchfit.explore`` on throughput curves recorded by ``bench/explore.py``: a tuning aid,
not the benchmark.

A full run of the benchmark takes 10-13 minutes and scores one exploration per example, on a
machine whose windows vary by 7-12%: a change to the exploration's rules cannot be judged from
one or two such runs. This script runs the real ``explore`` (its rounds, its chooser, its stopping
rules) hundreds of times against a model of the measurements, built from a recorded run's truth:

* the throughput at a batch size is the truth's level (its median polish); for a size it did
  not measure, the line in log-log between the measured neighbours, off it by a fixed bump
  (``UNMEASURED_BUMP``);
* the machine's drift is the recorded one: the common factors of the passes over every size
  (their median polish), played back in turn from a random pass on, each lasting as long as
  such a pass takes in the model (slow spells included, as they came);
* each window adds a residual of the recorded windows at that size (about the fit, drawn with
  replacement), scaled by the square root of 3 steps over the window's steps (the recorded
  windows were 3 steps long; shorter windows are noisier);
* time is the model's alone: a step at a batch size takes batch size (x tokens) over its
  throughput, and each round adds ``ROUND_OVERHEAD_SECONDS`` for the chooser's own work. No clock
  explore reads is the machine's, so a replay gives the same result on a loaded machine as on an
  idle one.

Each replay's quality (the truth at the pick over the truth's best, as in the benchmark) and its
time over the modelled sweep's (every sweep size, a warm-up step, a discarded window and
``SWEEP_WINDOWS`` windows of 3 steps) are tallied per example. What it cannot show: effects the
model leaves out (the first step after another shape, the allocator), and a residual of the
truth's passes holds the drift within a pass over every size (1-8 s), more than one of explore's
rounds over 3-5 sizes (0.2-2 s) sees. So compare variants on the same curves, with a few hundred
replays each (``--set``), and confirm with the benchmark itself.

Run: ``.venv/bin/python bench/explore_replay.py bench/results/explore.json [more.json ...]
[--replays 200] [--set batchfit.explore.FOCUS_TIME_FACTOR=2 ...]`` (about 10 s per 100 replays
of an example).
"""

from __future__ import annotations

import argparse
import bisect
import importlib
import json
import math
import random
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import batchfit

explore_module = importlib.import_module("batchfit.explore")  # the package's "explore" is the function

sys.path.insert(0, str(Path(__file__).resolve().parent))
from explore import QUALITY_TARGET, STEPS_PER_WINDOW, SWEEP_WINDOWS, TIME_TARGET, polish, table_of  # noqa: E402

TOKENS = {"transformer": 128}  # tokens per sample of the built-in examples that count tokens
#: A size the truth did not measure is off the line between its neighbours by this much (a
#: standard deviation of logarithms, fixed per size): kernels tile unevenly, and a line would
#: flatter an exploration that leans on one.
UNMEASURED_BUMP = 0.02
#: The chooser's work between two rounds (its bootstraps), in modelled seconds: about what it
#: takes on the development machine, fixed so that the replay does not depend on the load.
ROUND_OVERHEAD_SECONDS = 0.005


@dataclass
class Curve:
    """One recorded example: its truth, its drift and its residuals."""

    name: str
    max_batch: int
    tokens: int
    sizes: list[int]  # the sweep's sizes, ascending
    level: dict[int, float]  # log-throughput (per second) at each recorded size
    residuals: dict[int, list[float]]  # each recorded size's window residuals about the fit
    drift: list[float]  # the recorded passes' common factors (log), in the order they ran
    pass_seconds: float  # how long one of those passes took (modelled)

    @classmethod
    def from_row(cls, row: dict[str, Any], source: str) -> Curve:
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
            row["max_batch"],
            tokens,
            sorted(int(b) for b in row["sweep"]["points"]),
            level,
            residuals,
            [effect[p] for p in full],
            pass_seconds,
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
        bump = random.Random(f"{self.name}:{batch}").gauss(0, UNMEASURED_BUMP)
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

    def sweep_seconds(self) -> float:
        windows = 1 + SWEEP_WINDOWS  # the discarded window and the counted ones
        return sum(self.step_seconds(b) * (1 + windows * STEPS_PER_WINDOW) for b in self.sizes)


class Clock:
    """The model's time: the modelled seconds of the steps and of the chooser's rounds, nothing real."""

    def __init__(self) -> None:
        self.offset = 0.0

    def perf_counter(self) -> float:
        return self.offset


class ModelMeter:
    """Stands in for ``batchfit.explore._Meter``: the same calls, windows drawn from the model."""

    def __init__(self, curve: Curve, clock: Clock, rng: random.Random) -> None:
        self.curve, self.clock, self.rng = curve, clock, rng
        self.steps: dict[int, int] = {}
        self.phase = rng.uniform(0, len(curve.drift) * curve.pass_seconds) - clock.perf_counter()

    def _advance(self, seconds: float) -> None:
        self.clock.offset += seconds

    def _drift_now(self) -> float:
        """The recorded passes' common factors played back in turn, from a random one on."""
        index = int((self.clock.perf_counter() + self.phase) / self.curve.pass_seconds)
        return self.curve.drift[index % len(self.curve.drift)]

    def warm_up(self, batch: int) -> None:
        step = self.curve.step_seconds(batch)
        self._advance(2 * step)  # the warm-up step and a one-step first window
        self.steps[batch] = max(1, math.ceil(explore_module.MIN_WINDOW_SECONDS / step))

    def rewarm(self, batch: int) -> None:
        self._advance(self.curve.step_seconds(batch))

    def window(self, batch: int) -> float:
        steps = self.steps[batch]
        scale = math.sqrt(STEPS_PER_WINDOW / steps)
        log_rate = (
            self.curve.log_rate(batch)
            + self._drift_now()
            + scale * self.rng.choice(self.curve.residual_pool(batch))
        )
        rate = math.exp(log_rate)
        self._advance(steps * batch * self.curve.tokens / rate)
        return rate  # per second, in the curve's unit (tokens for the transformer)

    def reset(self) -> None:  # called once a round, when the chooser runs
        self._advance(ROUND_OVERHEAD_SECONDS)

    def close(self) -> None:
        pass


@dataclass
class Replay:
    pick: int
    quality: float
    time_ratio: float
    stop_reason: str
    confidence: int


def replay(curve: Curve, seed: int, **options: Any) -> Replay:
    rng = random.Random(seed)
    clock = Clock()
    originals = explore_module._Meter, explore_module.time
    explore_module._Meter = lambda *args, **kwargs: ModelMeter(curve, clock, rng)  # type: ignore[assignment,misc]
    explore_module.time = SimpleNamespace(perf_counter=clock.perf_counter)  # type: ignore[assignment]
    try:
        workload = SimpleNamespace(tokens_per_sample=curve.tokens if curve.tokens > 1 else None)
        result = batchfit.explore(workload, device="cpu", max_batch=curve.max_batch, **options)  # type: ignore[arg-type]
    finally:
        explore_module._Meter, explore_module.time = originals  # type: ignore[misc]
    pick = result.recommendation.batch_size
    return Replay(
        pick,
        math.exp(curve.log_rate(pick) - curve.best),
        result.explore_seconds / curve.sweep_seconds(),
        result.stop_reason,
        result.recommendation.confidence,
    )


def summarise(curve: Curve, replays: list[Replay]) -> str:
    qualities = sorted(r.quality for r in replays)
    times = sorted(r.time_ratio for r in replays)
    met = sum(r.quality >= QUALITY_TARGET for r in replays) / len(replays)
    both = sum(r.quality >= QUALITY_TARGET and r.time_ratio <= TIME_TARGET for r in replays) / len(replays)
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
        f"p90 {times[9 * len(times) // 10]:.2f}  picks {common}\n{'':<26}misses: {missed or 'none'}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("runs", nargs="+", type=Path, help="results files of bench/explore.py")
    parser.add_argument("--replays", type=int, default=200)
    parser.add_argument("--examples", default="mlp,cnn,transformer")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="MODULE.NAME=VALUE",
        help="override a constant for a what-if, e.g. batchfit.explore.FOCUS_TIME_FACTOR=2",
    )
    args = parser.parse_args(argv)
    for assignment in args.set:
        target, value = assignment.split("=", 1)
        module_name, name = target.rsplit(".", 1)
        module = importlib.import_module(module_name)
        if not hasattr(module, name):
            parser.error(f"--set {assignment}: {module_name} has no {name}")
        setattr(module, name, type(getattr(module, name))(float(value)))
    curves = [
        Curve.from_row(row, path.stem)
        for path in args.runs
        for row in json.loads(path.read_text())["rows"]
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
        replays = [replay(curve, seed) for seed in range(args.replays)]
        print(summarise(curve, replays), flush=True)
        total_met += sum(r.quality >= QUALITY_TARGET and r.time_ratio <= TIME_TARGET for r in replays)
        total += len(replays)
    print(f"all: both targets met in {total_met / total:.1%} of {total} replays")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

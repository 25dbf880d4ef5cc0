"""Replay explore's policy on throughput curves recorded by ``bench/explore.py`` (a tuning aid).

It runs ``batchfit.policy.explore.exploration.explore_rounds`` (its rounds, its chooser, its stopping
rules) hundreds of times against a model of the measurements built from a recorded run's truth,
on a modelled clock, and tallies per curve the quality and the time over three interleaved passes
of the sweep's sizes (the target: quality at least 0.97 in at most half that time) and over the
modelled sequential sweep's.
The same seed gives the same replay on any machine. It is a model, not the benchmark: compare
variants of the rules (``--set``) on the same curves, and confirm with the benchmark itself.

Run: ``.venv/bin/python bench/explore_replay.py [RESULTS.json ...] [--replays 200]
[--set focus_time_factor=2 ...] [--json PATH]`` (default: the ``RECORDED`` curves; about 5 s per
100 replays of a curve).
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import math
import random
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import _harness
import torch
from _explore_rows import QUALITY_TARGET

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
#: The passes of the interleaved sweep explore's time is set against, and the target: at most
#: half of their time (issue 54).
INTERLEAVED_PASSES = 3
INTERLEAVED_TARGET = 0.5
#: The recorded curves replayed by default: the cnn on the 2-core CPU (an older recording, and one
#: made after the rules were set, held out from their tuning), ResNet-50 with AMP on an H200.
RECORDED = (
    "tests/bench/data/explore_bench_cnn.json",
    "bench/data/cpu-2026-12-08/explore-cpu-cnn.json",
    "bench/data/h200-2026-11-26/explore-cuda-resnet50-amp.json",
)
RESULTS_PATH = _harness.RESULTS / "explore-replay.json"


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


@dataclass
class Replay:
    pick: int
    quality: float
    time_ratio: float
    interleaved_ratio: float  # explore's time over three passes of an interleaved sweep
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
        exploration.seconds / curve.interleaved_seconds(),
        exploration.stop_reason,
        exploration.recommendation.confidence,
    )


def summarise(curve: Curve, replays: list[Replay]) -> dict[str, Any]:
    """One curve's replays in figures: quality and time (over three interleaved passes and over
    the sequential sweep), how often both targets are met, the stop reasons, the common picks."""
    qualities = sorted(r.quality for r in replays)
    interleaved = sorted(r.interleaved_ratio for r in replays)
    picks: dict[int, int] = {}
    reasons: dict[str, int] = {}
    for r in replays:
        picks[r.pick] = picks.get(r.pick, 0) + 1
        reasons[r.stop_reason] = reasons.get(r.stop_reason, 0) + 1
    share = len(replays)
    return {
        "curve": curve.name,
        "device": curve.device,
        "max_batch_size": curve.max_batch_size,
        "replays": share,
        "rule_pick": curve.rule_pick,
        "interleaved_seconds": curve.interleaved_seconds(),
        "sweep_seconds": curve.sweep_seconds(),
        "quality_met": sum(q >= QUALITY_TARGET for q in qualities) / share,
        "quality_p10": qualities[share // 10],
        "quality_median": statistics.median(qualities),
        "interleaved_ratio_median": statistics.median(interleaved),
        "interleaved_ratio_p90": interleaved[9 * share // 10],
        "sweep_ratio_median": statistics.median(r.time_ratio for r in replays),
        "both_met": sum(
            r.quality >= QUALITY_TARGET and r.interleaved_ratio <= INTERLEAVED_TARGET for r in replays
        )
        / share,
        "no_larger": sum(r.pick <= curve.rule_pick for r in replays) / share,
        "confident": reasons.get("confident", 0) / share,
        "confidence_median": statistics.median(r.confidence for r in replays),
        "stop_reasons": reasons,
        "picks": {str(b): n for b, n in sorted(picks.items(), key=lambda item: -item[1])},
    }


def line(row: dict[str, Any]) -> str:
    common = ", ".join(f"{b}:{n}" for b, n in list(row["picks"].items())[:5])
    return (
        f"{row['curve']:<28} quality>={QUALITY_TARGET} {row['quality_met']:>5.0%} (p10 "
        f"{row['quality_p10']:.3f})  time/3 interleaved passes median {row['interleaved_ratio_median']:.2f} "
        f"p90 {row['interleaved_ratio_p90']:.2f} (sweep {row['sweep_ratio_median']:.2f})  both "
        f"{row['both_met']:>4.0%}  confident {row['confident']:.0%}  picks {common}\n{'':<28} no larger "
        f"than the rule's {row['rule_pick']} in {row['no_larger']:.0%}"
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


def curves_of(paths: list[Path], examples: set[str] | None) -> list[Curve]:
    """Every recorded row (with passes) of the results files at ``paths``, or of ``examples``."""
    found = []
    for path in paths:
        results = json.loads(path.read_text())
        for row in results["rows"]:
            if (examples is None or row["example"] in examples) and "passes" in next(
                iter(row["sweep"]["points"].values())
            ):
                found.append(Curve.from_row(row, path.stem, str(results.get("device", "cpu"))))
    return found


def main(argv: list[str] | None = None) -> int:
    parser = _harness.parser(__doc__, quick="20 replays a curve", json_default=str(RESULTS_PATH))
    parser.add_argument(
        "runs", nargs="*", type=Path, help="results files of bench/explore.py (default: RECORDED)"
    )
    parser.add_argument("--replays", type=int, default=200)
    parser.add_argument("--examples", default=None, help="only these examples (default: every row)")
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
    session = _harness.Session(torch.device("cpu"), ("torch", "batchfit"))
    print(session.machine())
    runs = args.runs or [_harness.ROOT / path for path in RECORDED]
    curves = curves_of(runs, None if args.examples is None else set(args.examples.split(",")))
    count = 20 if args.quick else args.replays
    rows = []
    for curve in curves:
        print(
            f"{curve.name}: {len(curve.drift)} passes of drift ({curve.pass_seconds:.2f} s each, sd "
            f"{statistics.pstdev(curve.drift):.3f}), three interleaved passes "
            f"{curve.interleaved_seconds():.1f} s, sweep {curve.sweep_seconds():.1f} s (modelled)",
            flush=True,
        )
        rows.append(summarise(curve, [replay(curve, seed, rules) for seed in range(count)]))
        print(line(rows[-1]), flush=True)
    both = sum(row["both_met"] * row["replays"] for row in rows) / sum(row["replays"] for row in rows)
    print(
        f"all: quality >= {QUALITY_TARGET} and time <= {INTERLEAVED_TARGET} of three interleaved "
        f"passes in {both:.1%}"
    )
    payload = {
        "rules": dataclasses.asdict(rules),
        "quality_target": QUALITY_TARGET,
        "interleaved_target": INTERLEAVED_TARGET,
        "interleaved_passes": INTERLEAVED_PASSES,
        "runs": [str(path.resolve().relative_to(_harness.ROOT)) for path in runs],
        "rows": rows,
    }
    _harness.save(args, session, RESULTS_PATH, payload)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

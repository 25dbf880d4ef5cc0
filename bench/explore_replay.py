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
from _replay_model import INTERLEAVED_PASSES, Curve, ModelMeter

# bench/ is the script's directory, so on sys.path.
from batchfit.errors import ConfigurationError
from batchfit.policy.explore.exploration import Rules, explore_rounds
from batchfit.policy.plan.micro_batch import micro_batch_sizes

#: The target: explore's time at most half of the interleaved passes' (issue 54).
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

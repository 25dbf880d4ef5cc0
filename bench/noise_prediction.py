"""The noise scale's prediction: the critical batch fitted to the steps a small task takes to a target
loss at batch sizes from about B_simple / 8 to 8 x B_simple, against B_simple measured early in the
runs by batchfit's own estimator.

    .venv/bin/python bench/noise_prediction.py            # 7 batch sizes, 5 seeds
    .venv/bin/python bench/noise_prediction.py --quick    # 2 batch sizes, 2 seeds, an easy target

The task: an MLP (32-128-10) learns a fixed random linear teacher's classes, 20% relabelled at
random, of fresh Gaussian inputs whose features have scales from 1 to 0.1 (so the loss's curvature
spans a factor of 100 and a run takes hundreds of steps, not tens), with plain SGD, until its
cross-entropy on one fixed held-out set (the same for every run) reaches the target. Each batch
size's learning rate is the one of a ladder of powers of two whose median steps to the target over
the seeds is fewest; the ladder starts at the previous batch size's rate and its neighbours and is
extended until the best is not at its edge. S(B) = S_min (1 + B_crit / B) is fitted to the medians.
B_simple is read (``batchfit.noise_scale``, fixed weights) at evenly spaced checkpoints of the
largest batch's runs at its rate, the runs closest to S_min's: "early" is the mean of the
checkpoints of the first half of the steps, from the start. Intervals are a bootstrap over seeds.
"""

from __future__ import annotations

import functools
import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
from _harness import RESULTS, Session, parser, save
from _noise_report import fitted, report, summary_lines
from _noise_task import (
    CLASSES,
    EVALUATE_EVERY,
    FEATURES,
    HELD_OUT,
    HIDDEN,
    LABEL_NOISE,
    TEACHER_SCALE,
    Run,
    Task,
    steps_to_target,
    student,
)
from torch import nn

import batchfit
from batchfit import Sampling
from batchfit.policy.noise.noise_scale import GradientReading, estimate

RATE_LADDER = tuple(2.0**power for power in range(-6, 7))  # 1/64 to 64
BOOTSTRAPS = 2000


@dataclass(frozen=True)
class Settings:
    """What one run of the bench measures."""

    batch_sizes: tuple[int, ...]
    seeds: int
    target_loss: float
    first_rates: tuple[float, ...]  # the smallest batch's starting ladder
    max_steps: int  # a run not at the target by then never gets there (a batch's later rates: 2x its best)
    checkpoints: int  # B_simple's checkpoints over the largest batch's steps to the target
    reading_batch: tuple[int, int]  # B_simple's big batch and micro-batch
    reading_steps: int  # readings per checkpoint and seed


FULL = Settings((32, 64, 128, 256, 512, 1024, 2048), 5, 1.40, (0.5, 1.0, 2.0), 3000, 8, (1024, 128), 10)
QUICK = Settings((64, 512), 2, 1.60, (1.0, 2.0), 600, 2, (256, 64), 4)


def median_steps(steps: Sequence[int | None]) -> float:
    """The median, a run that never reached the target counting as infinitely long."""
    return statistics.median(math.inf if value is None else value for value in steps)


def sweep(task: Task, batch_size: int, start: Sequence[float], settings: Settings) -> dict[str, Any]:
    """The ladder's rates from ``start``, extended until the fewest median steps is not at its edge."""
    tried: dict[float, list[int | None]] = {}
    rates = sorted(start)
    while True:
        for rate in rates:
            if rate not in tried:
                best = min((median_steps(s) for s in tried.values()), default=math.inf)
                cap = settings.max_steps if math.isinf(best) else min(settings.max_steps, 2 * int(best))
                runs = [Run(task, seed, batch_size, rate) for seed in range(settings.seeds)]
                tried[rate] = [steps_to_target(run, settings.target_loss, cap) for run in runs]
                print(f"  batch {batch_size} lr {rate:g}: steps {tried[rate]}", flush=True)
        ranked = sorted(tried)
        best_rate = min(ranked, key=lambda rate: (median_steps(tried[rate]), rate))
        index = RATE_LADDER.index(best_rate)
        edge = best_rate in (ranked[0], ranked[-1]) and 0 < index < len(RATE_LADDER) - 1
        if not edge or math.isinf(median_steps(tried[best_rate])):
            break
        rates = [RATE_LADDER[index - 1] if best_rate == ranked[0] else RATE_LADDER[index + 1]]
    return {
        "batch_size": batch_size,
        "learning_rate": best_rate,
        "steps": tried[best_rate],
        "median_steps": median_steps(tried[best_rate]),
        "sweep": [{"learning_rate": rate, "steps": tried[rate]} for rate in sorted(tried)],
    }


def fit(batch_sizes: Sequence[int], steps: Sequence[float]) -> tuple[float, float]:
    """``(S_min, B_crit)`` of S(B) = S_min + S_min B_crit / B, least squares in 1/B weighted by
    1 / S^2 (relative residuals: the steps span a factor of ten, their spread with them)."""
    rows = [(1 / batch, step) for batch, step in zip(batch_sizes, steps, strict=True) if math.isfinite(step)]
    weights = [1 / step**2 for _, step in rows]
    total = math.fsum(weights)
    mean_x = math.fsum(w * x for w, (x, _) in zip(weights, rows, strict=True)) / total
    mean_y = math.fsum(w * y for w, (_, y) in zip(weights, rows, strict=True)) / total
    covariance = math.fsum(w * (x - mean_x) * (y - mean_y) for w, (x, y) in zip(weights, rows, strict=True))
    variance = math.fsum(w * (x - mean_x) ** 2 for w, (x, _) in zip(weights, rows, strict=True))
    slope = covariance / variance
    s_min = mean_y - slope * mean_x
    return s_min, slope / s_min if s_min > 0 else math.inf


def read_checkpoints(
    task: Task, batch_size: int, rate: float, steps: int, settings: Settings
) -> list[list[list[GradientReading]]]:
    """Per seed, per checkpoint (``settings.checkpoints + 1`` evenly spaced over ``steps`` from the
    start), the readings of ``batchfit.noise_scale`` at the weights of the run at that step."""
    big, micro = settings.reading_batch
    marks = [round(index * steps / settings.checkpoints) for index in range(settings.checkpoints + 1)]
    found = []
    for seed in range(settings.seeds):
        run, per_mark = Run(task, seed, batch_size, rate), []
        workload = batchfit.Workload(
            run.model,
            make_batch=functools.partial(_fresh, task, torch.Generator().manual_seed(20_000 + seed)),
            loss_fn=nn.functional.cross_entropy,
        )
        sampling = Sampling(
            batch_size=big, micro_batch_size=micro, steps=settings.reading_steps, fixed_weights=True
        )
        for mark in marks:
            while run.steps < mark:
                run.step()
            per_mark.append(list(batchfit.noise_scale(workload, sampling=sampling, device="cpu").readings))
        found.append(per_mark)
    return found


def _fresh(task: Task, generator: torch.Generator, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    return task.draw(size, generator)


def b_simple(readings: list[list[list[GradientReading]]], seeds: Sequence[int], marks: int) -> list[float]:
    """B_simple at each of the first ``marks`` checkpoints, over the readings of ``seeds``."""
    return [estimate([r for seed in seeds for r in readings[seed][mark]]).b_simple for mark in range(marks)]


def summary(
    rows: list[dict[str, Any]], readings: list[list[list[GradientReading]]], seeds: Sequence[int], early: int
) -> dict[str, float]:
    """B_crit, S_min and B_simple (at the start, early, over the run) on ``seeds``' runs."""
    sizes = [row["batch_size"] for row in rows]
    s_min, b_crit = fit(sizes, [median_steps([row["steps"][seed] for seed in seeds]) for row in rows])
    scales = b_simple(readings, seeds, len(readings[0]))
    return {
        "s_min": s_min,
        "b_crit": b_crit,
        "b_simple_start": scales[0],
        "b_simple_early": statistics.fmean(scales[: early + 1]),
        "b_simple_run": statistics.fmean(scales),
    }


def bootstrap(
    rows: list[dict[str, Any]], readings: list[list[list[GradientReading]]], seeds: int, early: int
) -> dict[str, list[float]]:
    """90% intervals of each summary figure and of B_crit over each B_simple, the seeds resampled."""
    draws = random.Random(0)
    samples: dict[str, list[float]] = {}
    for _ in range(BOOTSTRAPS):
        chosen = [draws.randrange(seeds) for _ in range(seeds)]
        figures = summary(rows, readings, chosen, early)
        for name in ("start", "early", "run"):
            figures[f"ratio_{name}"] = figures["b_crit"] / figures[f"b_simple_{name}"]
        for name, value in figures.items():
            samples.setdefault(name, []).append(value)
    return {name: [quantile(values, 0.05), quantile(values, 0.95)] for name, values in samples.items()}


def quantile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def main(argv: list[str] | None = None) -> None:
    args = parser(
        __doc__,
        quick="2 batch sizes, 2 seeds, an easy target",
        json_default="bench/results/noise-prediction-cpu.json",
    ).parse_args(argv)
    if args.device != "cpu":
        raise SystemExit("bench/noise_prediction.py trains on the CPU; --device cpu only.")
    torch.set_num_threads(1)
    settings = QUICK if args.quick else FULL
    session = Session(torch.device("cpu"), ["torch", "batchfit"])
    print(session.machine())
    task, rows, start = Task(), [], settings.first_rates
    print(f"held-out loss at the start: {task.loss(student(0)):.3f}, target {settings.target_loss}")
    for batch_size in settings.batch_sizes:
        rows.append(sweep(task, batch_size, start, settings))
        rate = rows[-1]["learning_rate"]
        index = RATE_LADDER.index(rate)
        start = RATE_LADDER[max(0, index - 1) : index + 2]
    largest = rows[-1]
    readings = read_checkpoints(
        task, largest["batch_size"], largest["learning_rate"], int(largest["median_steps"]), settings
    )
    early = settings.checkpoints // 2
    seeds = range(settings.seeds)
    found = summary(rows, readings, seeds, early)
    intervals = bootstrap(rows, readings, settings.seeds, early)
    report(rows, found, intervals)
    payload = {
        "workload": f"mlp {FEATURES}-{HIDDEN}-{CLASSES}, SGD, {LABEL_NOISE:.0%} label noise",
        "task": task_record(settings),
        "rows": [{**row, "fitted_steps": fitted(found, row["batch_size"])} for row in rows],
        "checkpoints": checkpoint_rows(readings, int(largest["median_steps"]), settings),
        "early_checkpoints": early + 1,
        "fit": found,
        "intervals": intervals,
        "lines": summary_lines(found, intervals),
        "ratios": {name: found["b_crit"] / found[f"b_simple_{name}"] for name in ("start", "early", "run")},
    }
    save(args, session, RESULTS / "noise-prediction-cpu.json", payload)


def task_record(settings: Settings) -> dict[str, Any]:
    """The task and the settings as the results file records them."""
    return {
        "features": FEATURES,
        "hidden": HIDDEN,
        "classes": CLASSES,
        "label_noise": LABEL_NOISE,
        "teacher_scale": TEACHER_SCALE,
        "held_out": HELD_OUT,
        "evaluate_every": EVALUATE_EVERY,
        "optimizer": "SGD",
        "rate_ladder": list(RATE_LADDER),
        "bootstraps": BOOTSTRAPS,
        **asdict(settings),
    }


def checkpoint_rows(
    readings: list[list[list[GradientReading]]], steps: int, settings: Settings
) -> list[dict[str, Any]]:
    """Each checkpoint's step and batchfit's estimate over every seed's readings there."""
    rows = []
    for mark in range(settings.checkpoints + 1):
        scale = estimate([r for per_seed in readings for r in per_seed[mark]])
        rows.append({"step": round(mark * steps / settings.checkpoints), **scale.to_dict()})
    return rows


if __name__ == "__main__":
    main()

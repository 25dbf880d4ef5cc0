"""The batch-size schedule's gain: samples and predicted wall-clock time to a target loss, the schedule
against fixed batches (the smallest and largest the plan allows), over seeds.

    .venv/bin/python bench/batch_schedule.py            # 5 seeds
    .venv/bin/python bench/batch_schedule.py --quick    # 1 seed, a short learning-rate sweep

The task: an MLP learns a fixed random teacher's classes of fresh Gaussian inputs, 20% of them
relabelled at random (label noise), until its loss on 16384 held-out samples reaches the target.
Every run is ``MicroBatchStep`` at the same micro-batch (so the same memory) with Adam: the fixed
runs at accumulation 2 (the smallest global batch that the monitor can read) and 16 (the most
accumulation ``plan`` allows), each at the learning rate a sweep found fastest for it; the schedule
starts at the smallest and grows with the noise scale (``BatchSchedule``), its learning rate the
smallest batch's, scaled by the square-root rule at each change. Predicted wall-clock time is the
sum over a run's steps of the step time measured here for that global batch (with the monitor for
the schedule), so the held-out evaluations are not counted.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Any

import torch
from _harness import RESULTS, Session, parser, print_markdown_table, print_text_table, ratio, save
from torch import nn

from batchfit import MicroBatchOptions, MicroBatchStep
from batchfit.policy.plan.batch_schedule import BatchSchedule
from batchfit.policy.plan.noise_monitor import NoiseScaleMonitor

FEATURES, HIDDEN, CLASSES = 32, 128, 10
LABEL_NOISE = 0.2
MICRO_BATCH_SIZE = 16
SMALLEST, LARGEST = 2, 16  # accumulation steps: global batches 32 and 256
MAX_STEPS = 3000
HELD_OUT = 16384  # its loss moves by about 0.005 between seeds: well inside the target's gap to the floor
TARGET_LOSS = 1.46  # cross-entropy on the held-out samples (about 1.42 at best: the label noise)
LEARNING_RATES = (1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2)
MONITOR_EVERY = 20


class Task:
    """The teacher and the held-out set of one seed; fresh training samples drawn on demand."""

    def __init__(self, seed: int) -> None:
        self.generator = torch.Generator().manual_seed(1000 + seed)
        teacher = torch.Generator().manual_seed(0)  # one task for every seed: only the draws differ
        self.teacher = torch.randn(FEATURES, CLASSES, generator=teacher) / math.sqrt(FEATURES)
        self.held_out = self.draw(HELD_OUT)

    def draw(self, samples: int) -> tuple[torch.Tensor, torch.Tensor]:
        inputs = torch.randn(samples, FEATURES, generator=self.generator)
        labels = (
            (4 * inputs @ self.teacher).softmax(dim=1).multinomial(1, generator=self.generator).squeeze(1)
        )
        noisy = torch.rand(samples, generator=self.generator) < LABEL_NOISE
        random = torch.randint(0, CLASSES, (samples,), generator=self.generator)
        return inputs, torch.where(noisy, random, labels)


def student(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, CLASSES))


@dataclass
class Run:
    """One training run to the target: how far it got, and at which global batch each step ran."""

    reached: bool
    steps: int
    samples: int
    batches: list[int]  # the global batch of each optimizer step
    changes: list[dict[str, Any]]


def train(seed: int, learning_rate: float, accumulation: int, schedule: BatchSchedule | None) -> Run:
    task, model = Task(seed), student(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=learning_rate)
    monitor = None if schedule is None else NoiseScaleMonitor(MONITOR_EVERY, schedule=schedule)
    step = MicroBatchStep(
        model,
        optimizer,
        loss_fn=nn.functional.cross_entropy,
        micro_batch_size=MICRO_BATCH_SIZE,
        options=MicroBatchOptions(noise_monitor=monitor),
    )
    batch, reached = MICRO_BATCH_SIZE * accumulation, False
    batches: list[int] = []
    while len(batches) < MAX_STEPS and not reached:
        step(task.draw(batch))
        batches.append(batch)
        batch = step.batch_size or batch
        with torch.no_grad():
            reached = bool(
                nn.functional.cross_entropy(model(task.held_out[0]), task.held_out[1]) <= TARGET_LOSS
            )
    changes = [] if monitor is None else [change.to_dict() for change in monitor.changes]
    return Run(reached, len(batches), sum(batches), batches, changes)


def step_seconds(accumulation: int, monitored: bool, repeats: int = 30) -> float:
    """The median wall-clock time of one optimizer step at ``accumulation`` micro-batches."""
    task, model = Task(0), student(0)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    monitor = NoiseScaleMonitor(10**9) if monitored else None
    step = MicroBatchStep(
        model,
        optimizer,
        loss_fn=nn.functional.cross_entropy,
        micro_batch_size=MICRO_BATCH_SIZE,
        options=MicroBatchOptions(noise_monitor=monitor),
    )
    batches = [task.draw(MICRO_BATCH_SIZE * accumulation) for _ in range(repeats + 5)]
    times = []
    for index, batch in enumerate(batches):
        began = time.perf_counter()
        step(batch)
        if index >= 5:  # the first steps warm up
            times.append(time.perf_counter() - began)
    return statistics.median(times)


def tuned_rate(accumulation: int, learning_rates: tuple[float, ...]) -> tuple[float, list[dict[str, Any]]]:
    """The learning rate that reaches the target in the fewest steps at ``accumulation`` (seed 0)."""
    sweep = []
    for rate in learning_rates:
        run = train(0, rate, accumulation, None)
        sweep.append({"learning_rate": rate, "reached": run.reached, "steps": run.steps})
        print(
            f"  sweep accumulation {accumulation} lr {rate:g}: {run.steps} steps"
            + ("" if run.reached else " (not reached)")
        )
    best = min(sweep, key=lambda row: (not row["reached"], row["steps"]))
    return best["learning_rate"], sweep


def summarise(name: str, runs: list[Run], seconds: dict[int, float]) -> dict[str, Any]:
    """Medians over the seeds of a method's steps, samples and predicted seconds to the target."""
    predicted = [sum(seconds[batch] for batch in run.batches) for run in runs]
    return {
        "method": name,
        "reached": sum(run.reached for run in runs),
        "steps": statistics.median(run.steps for run in runs),
        "samples": statistics.median(run.samples for run in runs),
        "predicted_seconds": statistics.median(predicted),
        "runs": [
            {
                "reached": run.reached,
                "steps": run.steps,
                "samples": run.samples,
                "predicted_seconds": time_,
                "changes": run.changes,
            }
            for run, time_ in zip(runs, predicted, strict=True)
        ],
    }


def main() -> None:
    args = parser(
        __doc__, quick="1 seed, two learning rates", json_default="bench/results/batch-schedule-cpu.json"
    ).parse_args()
    if args.device != "cpu":
        raise SystemExit("bench/batch_schedule.py trains on the CPU; --device cpu only.")
    torch.set_num_threads(1)
    session = Session(torch.device("cpu"), ["torch", "batchfit"])
    print(session.machine())
    seeds = range(1 if args.quick else 5)
    rates = LEARNING_RATES[1:3] if args.quick else LEARNING_RATES
    accumulations = [2**power for power in range(1, 5)]  # every global batch a run can take
    seconds = {MICRO_BATCH_SIZE * acc: step_seconds(acc, False) for acc in accumulations}
    monitored = {MICRO_BATCH_SIZE * acc: step_seconds(acc, True) for acc in accumulations}
    small_rate, small_sweep = tuned_rate(SMALLEST, rates)
    large_rate, large_sweep = tuned_rate(LARGEST, rates)
    schedule = BatchSchedule(max_accumulation_steps=LARGEST, min_steps=MONITOR_EVERY)
    methods = [
        (f"fixed {MICRO_BATCH_SIZE * SMALLEST} (lr {small_rate:g})", SMALLEST, small_rate, None, seconds),
        (f"fixed {MICRO_BATCH_SIZE * LARGEST} (lr {large_rate:g})", LARGEST, large_rate, None, seconds),
        (
            f"schedule {MICRO_BATCH_SIZE * SMALLEST}-{MICRO_BATCH_SIZE * LARGEST} (lr {small_rate:g}, sqrt)",
            SMALLEST,
            small_rate,
            schedule,
            monitored,
        ),
    ]
    rows = []
    for name, accumulation, rate, chosen, times in methods:
        runs = [train(seed, rate, accumulation, chosen) for seed in seeds]
        rows.append(summarise(name, runs, times))
        print(f"  {name}: {[run.steps for run in runs]} steps")
    print_rows(rows, len(seeds))
    payload = {
        "task": task(len(seeds)),
        "step_seconds": seconds,
        "step_seconds_monitored": monitored,
        "sweeps": {"smallest": small_sweep, "largest": large_sweep},
        "rows": rows,
    }
    save(args, session, RESULTS / "batch-schedule-cpu.json", payload)


def print_rows(rows: list[dict[str, Any]], seeds: int) -> None:
    """Each method's row as text and as Markdown, the schedule's (the last) samples and time over each."""
    base = rows[2]
    headers = [
        "method",
        "reached",
        "steps",
        "samples",
        "predicted s",
        "schedule's samples / this",
        "schedule's time / this",
    ]
    lines = [
        [
            row["method"],
            f"{row['reached']}/{seeds}",
            f"{row['steps']:.0f}",
            f"{row['samples']:.0f}",
            f"{row['predicted_seconds']:.2f}",
            ratio(base["samples"], row["samples"]),
            ratio(base["predicted_seconds"], row["predicted_seconds"]),
        ]
        for row in rows
    ]
    print_text_table(headers, lines)
    print()
    print_markdown_table(headers, lines, {0})


def task(seeds: int) -> dict[str, Any]:
    """The task the results file records: the student, the data and the target."""
    return {
        "features": FEATURES,
        "hidden": HIDDEN,
        "classes": CLASSES,
        "label_noise": LABEL_NOISE,
        "micro_batch_size": MICRO_BATCH_SIZE,
        "target_loss": TARGET_LOSS,
        "max_steps": MAX_STEPS,
        "held_out": HELD_OUT,
        "monitor_every": MONITOR_EVERY,
        "seeds": seeds,
    }


if __name__ == "__main__":
    main()

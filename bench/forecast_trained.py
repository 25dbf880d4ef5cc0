"""Benchmark the fake-tensor forecast mid-training: ``find_batch_size`` from a fresh AdamW against
the same workload after one real AdamW step (a resume, ``apply_autobatch`` after a checkpoint).

Each case searches the same model twice, each in its own process (``OMP_NUM_THREADS=1``): "fresh"
with a new optimizer, "trained" after one training step at batch 4, whose optimizer then holds
AdamW's ``step`` tensors. The forecast should place the trials as it does from a fresh optimizer:
the same real trials, the same answer. Reported per case: the real trials' batch sizes, the answer,
the fake-tensor traces that placed them, and the search's wall and CPU seconds (medians of
``--repeats`` runs).

Run: ``.venv/bin/python bench/forecast_trained.py [--quick] [--repeats 3]``.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import _harness
import torch
from torch import nn

from batchfit import Workload, find_batch_size
from batchfit.runtime.workloads.examples import build_example

#: (case, memory cap): the built-ins and a BatchNorm CNN, each with AdamW.
CASES = [("mlp", "48MiB"), ("cnn", "256MiB"), ("transformer", "512MiB"), ("batchnorm-cnn", "16MiB")]
RESULTS = Path(__file__).resolve().parent / "results"


def batchnorm_cnn() -> Workload:
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, 10),
    )

    def make_batch(count: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(count, 3, 16, 16), torch.randint(0, 10, (count,))

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return Workload(model, optimizer, make_batch=make_batch, loss_fn=nn.functional.cross_entropy)


def workload(case: str) -> Workload:
    if case == "batchnorm-cnn":
        return batchnorm_cnn()
    built = build_example(case, "cpu")
    return built.replaced(optimizer=torch.optim.AdamW(built.model.parameters(), lr=1e-3))


def one_step(built: Workload) -> None:
    """One real AdamW step at batch 4: the optimizer then holds its state."""
    optimizer = built.optimizer
    if not isinstance(optimizer, torch.optim.Optimizer) or built.loss_fn is None:
        raise TypeError("the bench's workloads have an optimizer and a loss")
    inputs, target = built.host_batch(4)
    optimizer.zero_grad()
    built.loss_fn(built.model(inputs), target).backward()
    optimizer.step()


def child(case: str, limit: str, trained: bool) -> dict[str, Any]:
    """One search, in this process: what the parent reads from its stdout."""
    torch.manual_seed(0)
    built = workload(case)
    if trained:
        one_step(built)
    cpu_began, wall_began = time.process_time(), time.perf_counter()
    result = find_batch_size(built, device="cpu", memory_limit=limit)
    return {
        "batch_size": result.batch_size,
        "trials": [trial.batch_size for trial in result.trials],
        "traces": len(result.predicted_trials),
        "wall_seconds": time.perf_counter() - wall_began,
        "forecast_skipped": result.forecast_skipped,
        "cpu_seconds": time.process_time() - cpu_began,
    }


def run(case: str, limit: str, trained: bool, repeats: int) -> dict[str, Any]:
    runs = []
    for _ in range(repeats):
        command = [sys.executable, __file__, "--child", case, limit, "trained" if trained else "fresh"]
        environment = {**os.environ, "OMP_NUM_THREADS": "1"}
        done = subprocess.run(command, capture_output=True, text=True, check=True, env=environment)
        runs.append(json.loads(done.stdout.splitlines()[-1]))
    if len({(json.dumps(one["trials"]), one["batch_size"]) for one in runs}) > 1:
        raise RuntimeError(f"{case} {limit}: the runs disagree: {runs}")
    return {
        "case": case,
        "limit": limit,
        "optimizer": "trained" if trained else "fresh",
        "batch_size": runs[0]["batch_size"],
        "trials": runs[0]["trials"],
        "forecast_skipped": runs[0]["forecast_skipped"],
        "traces": runs[0]["traces"],
        "wall_seconds": statistics.median(one["wall_seconds"] for one in runs),
        "cpu_seconds": statistics.median(one["cpu_seconds"] for one in runs),
        "repeats": repeats,
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        print(json.dumps(child(argv[1], argv[2], argv[3] == "trained")))
        return 0
    parser = _harness.parser(__doc__, quick="the mlp and cnn only, 1 run each", json_default="bench/results/")
    parser.add_argument("--repeats", type=int, default=3, help="runs per row (median)")
    args = parser.parse_args(argv)
    session = _harness.Session(torch.device("cpu"), ["torch", "batchfit"])
    print(session.machine())
    cases, repeats = (CASES[:2], 1) if args.quick else (CASES, args.repeats)
    rows = [run(case, limit, trained, repeats) for case, limit in cases for trained in (False, True)]
    lines = [
        [row["case"], row["limit"], row["optimizer"], str(row["batch_size"]),
         ", ".join(map(str, row["trials"])), str(row["traces"]),
         f"{row['wall_seconds']:.2f}", f"{row['cpu_seconds']:.2f}"]
        for row in rows
    ]  # fmt: skip
    _harness.print_text_table(
        ["case", "cap", "optimizer", "answer", "real trials", "traces", "wall s", "CPU s"], lines
    )
    _harness.save(args, session, RESULTS / "forecast-trained-cpu.json", {"rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The ranks of the lockstep tests: each a real process in a real gloo group (spawned by
test_lockstep.py), searching a tiny MLP on a capped CPU that plays its own device."""

from __future__ import annotations

import dataclasses
import json
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from tiny_workloads import build, classification_batch
from torch import nn
from two_ranks import leave_group

from batchfit import Workload, analyze, compare, explore, find_batch_size
from batchfit.find import find_on
from batchfit.runtime.caching import CachingCpuDevice
from batchfit.units import parse_bytes


def _failing(rank: int, error_rank: int, error: BaseException, after_steps: int) -> Workload:
    """The MLP whose train step on ``error_rank`` raises ``error`` at its ``after_steps``-th real step."""
    workload = build("mlp", "sgd")
    steps = [0]

    def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, batch: Any) -> None:
        inputs, target = batch
        optimizer.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(inputs), target).backward()
        optimizer.step()
        if rank == error_rank and not isinstance(inputs, torch._subclasses.FakeTensor):
            steps[0] += 1
            if steps[0] == after_steps:
                raise error

    workload.train_step = train_step
    return workload


def run(rank: int, scenario: str, limits: list[str]) -> dict[str, Any]:
    if scenario == "capacities":
        workload = build("mlp", "sgd")
    elif scenario == "value-error":
        workload = _failing(rank, 1, ValueError("a bug in rank 1's step"), after_steps=3)
    elif scenario == "interrupt":
        workload = _failing(rank, 1, KeyboardInterrupt(), after_steps=3)
    elif scenario == "explore":
        return explore_report(build("mlp", "sgd"), limits[rank])
    elif scenario == "analyze":
        return analyze_report(build("mlp", "sgd"), limits[rank])
    elif scenario == "compare":
        return compare_report(build("mlp", "sgd"), limits[rank])
    elif scenario == "caching":
        return caching_report(limits[rank], (3, 24, 24) if rank == 1 else (3, 16, 16))
    else:
        raise ValueError(scenario)
    result = find_batch_size(workload, device="cpu", memory_limit=limits[rank], max_batch_size=4096)
    return {
        "batch_size": result.batch_size,
        "budget_bytes": result.budget_bytes,
        "trials": [trial.batch_size for trial in result.trials],
        "outcomes": [trial.outcome for trial in result.trials],
        "details": [trial.detail for trial in result.trials],
    }


def caching_report(limit: str, image: tuple[int, ...]) -> dict[str, Any]:
    """find on the CPU with CUDA's caching allocator modelled, capped at ``limit`` on this rank,
    the CNN on this rank's ``image`` shape (ranks whose steps make other requests)."""
    workload = build("cnn", "sgd")
    workload.make_batch = classification_batch(image)
    result = find_on(CachingCpuDevice(parse_bytes(limit)), workload, "train", max_batch_size=4096)
    return {
        "batch_size": result.batch_size,
        "trials": [trial.batch_size for trial in result.trials],
        "outcomes": [trial.outcome for trial in result.trials],
        "replays": result.replays,
    }


def explore_report(workload: Workload, limit: str) -> dict[str, Any]:
    """explore on the capped CPU up to the memory-safe maximum, briefly."""
    result = explore(workload, device="cpu", memory_limit=limit, time_budget_seconds=3, confidence_target=80)
    return {
        "max_batch_size": result.max_batch_size,
        "points": [point.to_dict() for point in result.points],
        "recommendation": result.recommendation.to_dict(),
        "stop_reason": result.stop_reason,
    }


def analyze_report(workload: Workload, limit: str) -> dict[str, Any]:
    """analyze at two fractions, train and eval, on the capped CPU."""
    analysis = analyze(workload, [0.6, 0.8], ["train", "eval"], device="cpu", memory_limit=limit)
    return {
        "rows": [[row.memory_fraction, row.mode, row.batch_size, row.budget_bytes] for row in analysis.rows],
        "trials_run": analysis.trials_run,
    }


def compare_report(workload: Workload, limit: str) -> dict[str, Any]:
    """compare with mixed precision and accumulation on the capped CPU, one timing round."""
    result = compare(
        workload,
        ["amp"],
        device="cpu",
        memory_limit=limit,
        global_batch_size=64,
        windows=1,
        explore_seconds=0,
    )
    return {"rows": [dataclasses.asdict(row) for row in result.rows]}


def main(rank: int, world_size: int, store: str, scenario: str, limits: list[str], out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{store}", rank=rank, world_size=world_size, timeout=timedelta(seconds=60)
    )
    started = time.perf_counter()
    report: dict[str, Any]
    try:
        report = run(rank, scenario, limits)
    except BaseException as error:
        report = {
            "error": type(error).__name__,
            "message": str(error),
            "notes": getattr(error, "__notes__", []),
        }
    report["seconds"] = time.perf_counter() - started
    Path(out, f"{rank}.json").write_text(json.dumps(report))
    leave_group()

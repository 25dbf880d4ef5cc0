"""find on a model in DistributedDataParallel, against DDP trained by force: two gloo ranks.

    .venv/bin/python bench/data_parallel.py            # CPU: two ranks, each a capped CPU device
    .venv/bin/python bench/data_parallel.py --quick    # the wide MLP alone

For each case every rank searches its model unwrapped and wrapped in DDP (in lockstep), then
trains DDP by force, 2 steps with its all-reduces, at each answer and the size after it: a fresh
model and optimizer, the DDP built inside ``batchfit.memory_limit`` at the search's budget, so its
gradient buckets are among the block's own allocations. The wrapped answer should train and the
next size not; the unwrapped answer, where it is larger, does not train in DDP.
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from _harness import RESULTS, Session, parser, print_text_table, write_results
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import batchfit
from batchfit.runtime.examples import build_example

#: (name, memory limit, memory fraction): the wide MLP's parameters outweigh its activations, the
#: examples' activations weigh more.
CASES = (("wide-mlp", "400MiB", 1.0), ("mlp", "56MiB", 0.8), ("cnn", "256MiB", 0.8))
MAX_BATCH_SIZE = 100_000
TIMEOUT_SECONDS = 900


def build(name: str) -> batchfit.Workload:
    """A fresh workload: the built-in example, or the MLP of four 2048-wide layers with AdamW."""
    if name != "wide-mlp":
        return build_example(name, "cpu")
    torch.manual_seed(0)
    model = nn.Sequential(
        *(nn.Sequential(nn.Linear(2048, 2048), nn.ReLU()) for _ in range(4)), nn.Linear(2048, 10)
    )

    def make_batch(size: int) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(size)
        return torch.randn(size, 2048, generator=generator), torch.randint(
            0, 10, (size,), generator=generator
        )

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return batchfit.Workload(model, optimizer, make_batch=make_batch, loss_fn=nn.functional.cross_entropy)


def trains_in_ddp(name: str, size: int, budget_bytes: int) -> bool:
    """Whether every rank trains 2 DDP steps of a fresh ``name`` at ``size`` under ``budget_bytes``."""
    workload = build(name)
    optimizer, make_batch, loss_fn = workload.build_optimizer(), workload.make_batch, workload.loss_fn
    assert optimizer is not None and make_batch is not None and loss_fn is not None
    inputs, target = make_batch(size)  # on the host, as a loader makes it: outside the cap
    fits = True
    try:
        with batchfit.memory_limit(budget_bytes, resident=[workload.model, optimizer]):
            network = DistributedDataParallel(workload.model)
            for _ in range(2):
                copies = inputs.clone(), target.clone()
                optimizer.zero_grad(set_to_none=True)
                loss_fn(network(copies[0]), copies[1]).backward()
                optimizer.step()
                del copies
    except torch.OutOfMemoryError:
        fits = False
    outcomes: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(outcomes, fits)
    return all(outcomes)


def measure(name: str, limit: str, fraction: float) -> dict[str, Any]:
    """One case on this rank: both searches, then DDP by force around both answers."""
    row: dict[str, Any] = {"case": name, "limit": limit, "memory_fraction": fraction}
    for key, wrap in (("unwrapped", False), ("wrapped", True)):
        workload = build(name)
        if wrap:
            workload = dataclasses.replace(workload, model=DistributedDataParallel(workload.model))
        started = time.perf_counter()
        result = batchfit.find_batch_size(
            workload,
            device="cpu",
            memory_limit=limit,
            memory_fraction=fraction,
            max_batch_size=MAX_BATCH_SIZE,
        )
        row[key] = {
            "batch_size": result.batch_size,
            "trials": [trial.batch_size for trial in result.trials],
            "seconds": time.perf_counter() - started,
            "wrapper_bytes": result.wrapper_bytes,
            "budget_bytes": result.budget_bytes,
        }
    budget, wrapped, unwrapped = row["wrapped"]["budget_bytes"], row["wrapped"], row["unwrapped"]
    wrapped["ddp_trains"] = [
        trains_in_ddp(name, size, budget) for size in (wrapped["batch_size"], wrapped["batch_size"] + 1)
    ]
    unwrapped["ddp_trains"] = trains_in_ddp(name, unwrapped["batch_size"], budget)
    return row


def rank_main(rank: int, store: str, cases: list[tuple[str, str, float]], out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{store}", rank=rank, world_size=2, timeout=timedelta(seconds=300)
    )
    rows = [measure(*case) for case in cases]
    Path(out, f"{rank}.json").write_text(json.dumps(rows))
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)  # torch 2.13's CPU build can abort in its C++ teardown after a gloo group


def run_ranks(cases: list[tuple[str, str, float]]) -> list[dict[str, Any]]:
    """Rank 0's rows, from two spawned ranks."""
    with tempfile.TemporaryDirectory() as folder:
        context = multiprocessing.get_context("spawn")
        ranks = [
            context.Process(target=rank_main, args=(rank, str(Path(folder, "store")), cases, folder))
            for rank in range(2)
        ]
        for process in ranks:
            process.start()
        for process in ranks:
            process.join(TIMEOUT_SECONDS)
        if any(process.is_alive() or process.exitcode != 0 for process in ranks):
            for process in ranks:
                process.kill()
            raise RuntimeError(f"the ranks did not finish cleanly: exit codes {[p.exitcode for p in ranks]}")
        rows: list[dict[str, Any]] = json.loads(Path(folder, "0.json").read_text())
        return rows


def yes_no(value: bool) -> str:
    return "yes" if value else "no"


def main() -> None:
    args = parser(
        __doc__, quick="the wide MLP alone", json_default="bench/results/data-parallel-cpu.json"
    ).parse_args()
    if args.device != "cpu":
        raise SystemExit("bench/data_parallel.py runs gloo ranks on capped CPUs; --device cpu only.")
    session = Session(torch.device("cpu"), ["torch"])
    print(session.machine())
    rows = run_ranks(list(CASES[:1] if args.quick else CASES))
    lines: list[list[str]] = []
    for row in rows:
        wrapped, unwrapped = row["wrapped"], row["unwrapped"]
        lines.append(
            [
                f"{row['case']} at {row['limit']} x {row['memory_fraction']:g}",
                f"{wrapped['wrapper_bytes'] / 2**20:.2f} MiB",
                str(unwrapped["batch_size"]),
                yes_no(unwrapped["ddp_trains"]),
                str(wrapped["batch_size"]),
                " / ".join(yes_no(fits) for fits in wrapped["ddp_trains"]),
                str(len(wrapped["trials"])),
                f"{wrapped['seconds']:.2f} s",
            ]
        )
    headers = [
        "case",
        "DDP buckets",
        "unwrapped",
        "trains in DDP",
        "wrapped",
        "trains in DDP / next",
        "trials",
        "seconds",
    ]
    print_text_table(headers, lines)
    print(session.finish())
    if not args.no_json:
        write_results(args.json or RESULTS / "data-parallel-cpu.json", {**session.to_dict(), "rows": rows})


if __name__ == "__main__":
    main()

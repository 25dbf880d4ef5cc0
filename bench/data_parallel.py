"""find on a model in DistributedDataParallel and on one sharded by FSDP2, against each trained
by force: two gloo ranks.

    .venv/bin/python bench/data_parallel.py            # CPU: two ranks, each a capped CPU device
    .venv/bin/python bench/data_parallel.py --quick    # the wide MLP alone, in DDP and in FSDP2

For each case every rank searches its model unwrapped and wrapped in DDP (in lockstep), then
trains DDP by force, 2 steps with its all-reduces, at each answer and the size after it: a fresh
model and optimizer, the DDP built inside ``batchfit.cap_memory`` at the search's budget, so its
gradient buckets are among the block's own allocations. The wrapped answer should train and the
next size not; the unwrapped answer, where it is larger, does not train in DDP.

The wide MLP is also sharded by ``fully_shard`` (each layer, then the whole) and searched as it
trains; its answer and the next size are trained by force, 2 steps with FSDP's all-gathers and
reduce-scatters, a fresh sharded model under the cap. The parameters' bytes that batchfit counts
are set beside their local shards' and their global size (a DTensor reports the global one).
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import tempfile
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from _harness import RESULTS, Session, parser, print_text_table, save
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel

import batchfit
from batchfit.runtime.devices.tracker import StorageTracker, resident_tensors
from batchfit.runtime.workloads.examples import build_example

#: (name, memory limit, memory fraction): the wide MLP's parameters outweigh its activations, the
#: examples' activations weigh more.
CASES = (("wide-mlp", "400MiB", 1.0), ("mlp", "56MiB", 0.8), ("cnn", "256MiB", 0.8))
#: (name, memory limit, memory fraction) of the sharded case: the wide MLP, half of it per rank.
SHARDED = ("wide-mlp", "400MiB", 1.0)
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


def sharded(name: str) -> batchfit.Workload:
    """A fresh workload whose model is sharded by FSDP2: each layer, then the whole (the root)."""
    workload = build(name)
    for layer in workload.model.children():
        if any(True for _ in layer.parameters()):
            fully_shard(layer)
    fully_shard(workload.model)
    optimizer = torch.optim.AdamW(workload.model.parameters(), lr=1e-3)  # over the shards
    return dataclasses.replace(workload, optimizer=optimizer)


def trains_sharded(name: str, size: int, budget_bytes: int) -> bool:
    """Whether every rank trains 2 steps of a fresh sharded ``name`` at ``size`` under ``budget_bytes``."""
    return trains_by_force(sharded(name), size, budget_bytes, lambda model: model)


def measure_sharded(name: str, limit: str, fraction: float) -> dict[str, Any]:
    """The sharded case on this rank: the search, then FSDP by force at its answer and the next size."""
    workload = sharded(name)
    parameters = list(workload.model.parameters())
    started = time.perf_counter()
    result = batchfit.find_batch_size(
        workload,
        device="cpu",
        memory_limit=limit,
        memory_fraction=fraction,
        sizes=batchfit.BatchSizes(max_batch_size=MAX_BATCH_SIZE),
    )
    seconds = time.perf_counter() - started
    tracker = StorageTracker()
    tracker.track(resident_tensors(workload.model))
    shards: list[Any] = parameters  # DTensors, whose local shard to_local() gives
    local = {s._cdata: s.nbytes() for s in (p.to_local().untyped_storage() for p in shards)}
    return {
        "case": name,
        "limit": limit,
        "memory_fraction": fraction,
        "batch_size": result.batch_size,
        "trials": [[trial.batch_size, trial.outcome] for trial in result.trials],
        "seconds": seconds,
        "trains": [
            trains_sharded(name, size, result.budget_bytes)
            for size in (result.batch_size, result.batch_size + 1)
        ],
        "counted_bytes": tracker.live_bytes,
        "local_bytes": sum(local.values()),
        "global_bytes": sum(p.numel() * p.element_size() for p in parameters),
    }


def trains_in_ddp(name: str, size: int, budget_bytes: int) -> bool:
    """Whether every rank trains 2 DDP steps of a fresh ``name`` at ``size`` under ``budget_bytes``."""
    return trains_by_force(build(name), size, budget_bytes, DistributedDataParallel)


def trains_by_force(
    workload: batchfit.Workload, size: int, budget_bytes: int, network_of: Callable[[nn.Module], nn.Module]
) -> bool:
    """Whether every rank trains 2 steps of ``network_of(workload.model)``, built inside the cap (a
    DDP's buckets are among its allocations), at ``size`` under ``budget_bytes``."""
    optimizer, make_batch, loss_fn = workload.build_optimizer(), workload.make_batch, workload.loss_fn
    assert optimizer is not None and make_batch is not None and loss_fn is not None
    inputs, target = make_batch(size)  # on the host, as a loader makes it: outside the cap
    fits = True
    try:
        with batchfit.cap_memory(budget_bytes, resident=[workload.model, optimizer]):
            network = network_of(workload.model)
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
            sizes=batchfit.BatchSizes(max_batch_size=MAX_BATCH_SIZE),
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
    Path(out, f"{rank}.json").write_text(json.dumps({"ddp": rows, "fsdp": [measure_sharded(*SHARDED)]}))
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)  # torch 2.13's CPU build can abort in its C++ teardown after a gloo group


def run_ranks(cases: list[tuple[str, str, float]]) -> dict[str, list[dict[str, Any]]]:
    """Rank 0's rows (DDP's, FSDP's), from two spawned ranks."""
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
        rows: dict[str, list[dict[str, Any]]] = json.loads(Path(folder, "0.json").read_text())
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
    for row in rows["ddp"]:
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
    print()
    print("FSDP2 (fully_shard), searched sharded as it trains:")
    fsdp_lines = [
        [
            f"{row['case']} at {row['limit']} x {row['memory_fraction']:g}",
            " / ".join(f"{row[key] / 2**20:.2f}" for key in ("global_bytes", "local_bytes", "counted_bytes"))
            + " MiB",
            str(row["batch_size"]),
            " / ".join(yes_no(fits) for fits in row["trains"]),
            f"{sum(outcome == 'oom' for _, outcome in row['trials'])} of {len(row['trials'])}",
            f"{row['seconds']:.2f} s",
        ]
        for row in rows["fsdp"]
    ]
    fsdp_headers = [
        "case",
        "parameters: global / shard / counted",
        "answer",
        "trains / next",
        "trials out of memory",
        "seconds",
    ]
    print_text_table(fsdp_headers, fsdp_lines)
    save(args, session, RESULTS / "data-parallel-cpu.json", {"rows": rows})


if __name__ == "__main__":
    main()

"""The ranks of the DDP-rebuild test: each a real process in a gloo group (spawned by
test_ddp_rebuild.py), searching a model in DDP on the CPU's model of CUDA's caching allocator and
training fresh DDPs by force there, the truth the search's answer is held to."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from two_ranks import report_and_leave

from batchfit import BatchSizes, Workload
from batchfit.runtime.devices.caching_device import CachingCpuDevice
from batchfit.runtime.devices.tracker import resident_tensors
from batchfit.runtime.distributed.data_parallel import reduced_bytes
from batchfit.search.find_batch_size import find_on
from batchfit.where import ResolvedDevice

#: A device whose caching allocator the DDP's buckets fragment: 16 MiB weights (4 x 4M float32,
#: one bucket of 65 MiB at first, 3 of 16-32 MiB after the rebuild) whose wide layers' outputs are
#: 512 KiB a sample, so that near the answer an activation's block is where a rebuilt bucket lands.
LIMIT_BYTES = 520 * 2**20
THIN, WIDE = 32, 131072
#: Where a search that holds one block of the buckets' bytes throughout answered (80 at 520 MiB),
#: and the module beside such a block still trains (its allocator's state recurs from step 3: 4
#: steps are every step); a fresh DDP does not.
HELD_FITS = 80


def parts() -> tuple[nn.Module, torch.optim.Optimizer]:
    """A fresh copy of the model (the same weights on every rank) and its AdamW."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(THIN, WIDE),
        nn.Linear(WIDE, THIN),
        nn.Linear(THIN, WIDE),
        nn.Linear(WIDE, THIN),
        nn.Linear(THIN, 10),
    )
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def make_batch(size: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(size)
    return torch.randn(size, THIN, generator=generator), torch.randint(0, 10, (size,), generator=generator)


def trains(size: int, budget_bytes: int, how: str = "ddp", steps: int = 10) -> tuple[bool, list[int]]:
    """Whether ``steps`` steps at ``size`` train by force under a cap at ``budget_bytes`` on every rank,
    behind the modelled allocator, and the rebuilt buckets' bytes DDP reports (empty: none).
    ``how``: "ddp", a fresh DDP built before the cap, as a user builds it before training (the cap
    empties the cache its construction left); "held", the plain module beside a tensor of the
    buckets' bytes allocated before the cap (what the trials held before they rebuilt them)."""
    model, optimizer = parts()
    batch = make_batch(size)  # on the host, outside the cap, as a data loader makes it
    device = CachingCpuDevice(LIMIT_BYTES)
    network: nn.Module = model
    held: list[torch.Tensor] = []  # for "held": the buckets' bytes, to the steps' end
    with device.measure(list(resident_tensors(model)), None):  # its allocations are the model's blocks
        if how == "ddp":
            network = DistributedDataParallel(model)
        else:
            held.append(torch.empty(reduced_bytes(model), dtype=torch.uint8))
    try:
        with device.measure(list(resident_tensors(model, optimizer)), budget_bytes):
            for _ in range(steps):
                inputs, target = (tensor.clone() for tensor in batch)
                optimizer.zero_grad(set_to_none=True)
                nn.functional.cross_entropy(network(inputs), target).backward()
                optimizer.step()
                del inputs, target
        fits = True
    except torch.OutOfMemoryError:
        fits = False
    held.clear()
    rebuilt = []
    if isinstance(network, DistributedDataParallel):
        sizes = str(network._get_ddp_logging_data().get("rebuilt_bucket_sizes", ""))
        rebuilt = [int(size) for size in sizes.split(",") if size.strip()]
    outcomes: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(outcomes, fits)
    return all(outcomes), rebuilt


def report() -> dict[str, Any]:
    """find on the model in DDP behind the modelled allocator; its answer and the next size trained
    by force in fresh DDPs; and a size above the answer where the module beside one block of the
    buckets' bytes trains and a fresh DDP does not."""
    model, optimizer = parts()
    plain = Workload(model, optimizer, make_batch=make_batch, loss_fn=nn.functional.cross_entropy)
    wrapped = dataclasses.replace(plain, model=DistributedDataParallel(model))
    found = find_on(
        ResolvedDevice(CachingCpuDevice(LIMIT_BYTES), 0.8), wrapped, "train", BatchSizes(max_batch_size=4096)
    )
    answer, budget = found.batch_size, found.budget_bytes
    fits, rebuilt = trains(answer, budget)
    return {
        "batch_size": answer,
        "trials": [trial.batch_size for trial in found.trials],
        "by_force": [fits, trains(answer + 1, budget)[0]],
        "above": [trains(HELD_FITS, budget, "held", steps=4)[0], trains(HELD_FITS, budget)[0]],
        "rebuilt_buckets": list(found.rebuilt_buckets),
        "ddp_rebuilt": rebuilt,
        "summary": found.summary(),
        "has_rebuilt_after": bool(wrapped.model._get_ddp_logging_data().get("has_rebuilt_buckets", 0)),
    }


def main(rank: int, world_size: int, store: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{store}", rank=rank, world_size=world_size, timeout=timedelta(seconds=60)
    )
    report_and_leave(out, rank, report)

"""The ranks of the FSDP tests: each a real process in a real gloo group (spawned by
test_sharded.py), searching an MLP sharded by FSDP2's ``fully_shard`` on a capped CPU."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.fsdp
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from two_ranks import report_and_leave

from batchfit import BatchSizes, Workload, cap_memory, find_batch_size
from batchfit.runtime.devices.tracker import StorageTracker, resident_tensors

#: FSDP2's ``fully_shard`` runs on the CPU from torch 2.7 (public from 2.6, where its CPU streams
#: lacked ``record_event``; before, ``torch.distributed._composable``, calling CUDA).
FULLY_SHARD = tuple(int(part) for part in torch.__version__.split(".")[:2]) >= (2, 7)
if FULLY_SHARD:
    from torch.distributed.fsdp import FSDPModule, fully_shard

WIDTH = 256


def sharded_mlp() -> tuple[nn.Module, torch.optim.Optimizer]:
    """Four 256-wide layers and a head, each layer sharded by ``fully_shard`` and the whole as the
    root (torchtitan's pattern), with AdamW: the same weights on every rank before sharding."""
    torch.manual_seed(0)
    model = nn.Sequential(
        *(nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU()) for _ in range(4)), nn.Linear(WIDTH, 10)
    )
    for layer in model[:4]:
        fully_shard(layer)
    fully_shard(model)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def make_batch(size: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(size)
    return torch.randn(size, WIDTH, generator=generator), torch.randint(0, 10, (size,), generator=generator)


def trains_capped(size: int, budget_bytes: int) -> bool:
    """Whether every rank trains 2 steps of a fresh sharded MLP at ``size`` under a cap at
    ``budget_bytes``, each step on a copy of the batch held to its end, as a training loop does."""
    model, optimizer = sharded_mlp()
    batch = make_batch(size)  # on the host, as a loader makes it: outside the cap
    fits = True
    try:
        with cap_memory(budget_bytes, resident=[model, optimizer]):
            for _ in range(2):
                inputs, target = (tensor.clone() for tensor in batch)
                optimizer.zero_grad(set_to_none=True)
                nn.functional.cross_entropy(model(inputs), target).backward()
                optimizer.step()
                del inputs, target
    except torch.OutOfMemoryError:
        fits = False
    outcomes: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(outcomes, fits)
    return all(outcomes)


def report(limit: str) -> dict[str, Any]:
    """find on the sharded MLP; the answer and the next size trained by force; whether the model
    and optimizer are as they were; the bytes batchfit counts for the parameters beside their
    local shards' and their global size."""
    model, optimizer = sharded_mlp()
    weights = [parameter.full_tensor().clone() for parameter in model.parameters()]
    workload = Workload(model, optimizer, make_batch=make_batch, loss_fn=nn.functional.cross_entropy)
    found = find_batch_size(workload, device="cpu", memory_limit=limit, sizes=BatchSizes(max_batch_size=4096))
    restored = all(
        torch.equal(weight, parameter.full_tensor())
        for weight, parameter in zip(weights, model.parameters(), strict=True)
    )
    tracker = StorageTracker()
    tracker.track(resident_tensors(model))
    local = {s._cdata: s.nbytes() for s in (p.to_local().untyped_storage() for p in model.parameters())}
    return {
        "batch_size": found.batch_size,
        "trials": [[trial.batch_size, trial.outcome] for trial in found.trials],
        "by_force": [
            trains_capped(size, found.budget_bytes) for size in (found.batch_size, found.batch_size + 1)
        ],
        "restored": restored,
        "optimizer_state": len(optimizer.state),
        "gradients": sum(parameter.grad is not None for parameter in model.parameters()),
        "counted_bytes": tracker.live_bytes,
        "local_bytes": sum(local.values()),
        "global_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
    }


def older_torch_report(limit: str) -> dict[str, Any]:
    """find on the sharded MLP as a torch from before ``FSDPModule.reset_iter_state`` (2.13) runs
    it, that method hidden for the search (torch 2.11, our GPU machines', has none): its trials,
    answer and restore, and whether batchfit warned that it could not reset FSDP's state."""
    hidden = FSDPModule.__dict__.get("reset_iter_state")
    if hidden is not None:
        delattr(FSDPModule, "reset_iter_state")
    warnings: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = warnings.append  # type: ignore[method-assign]
    logging.getLogger("batchfit.runtime.distributed.sharded").addHandler(handler)
    try:
        model, optimizer = sharded_mlp()
        weights = [parameter.full_tensor().clone() for parameter in model.parameters()]
        workload = Workload(model, optimizer, make_batch=make_batch, loss_fn=nn.functional.cross_entropy)
        found = find_batch_size(
            workload, device="cpu", memory_limit=limit, sizes=BatchSizes(max_batch_size=4096)
        )
    finally:
        logging.getLogger("batchfit.runtime.distributed.sharded").removeHandler(handler)
        if hidden is not None:
            FSDPModule.reset_iter_state = hidden  # type: ignore[attr-defined]
    return {
        "batch_size": found.batch_size,
        "trials": [[trial.batch_size, trial.outcome] for trial in found.trials],
        "restored": all(
            torch.equal(weight, parameter.full_tensor())
            for weight, parameter in zip(weights, model.parameters(), strict=True)
        ),
        "warned": [record.getMessage() for record in warnings],
    }


def zero_mlp(wrap: bool = True) -> tuple[nn.Module, torch.optim.Optimizer]:
    """The MLP (as ``sharded_mlp``, unsharded) in DDP (unless not ``wrap``), its AdamW sharded by
    ZeroRedundancyOptimizer."""
    # Imported here: its import warns of torch.jit's deprecation, in the test process too.
    from torch.distributed.optim import ZeroRedundancyOptimizer

    torch.manual_seed(0)
    model = nn.Sequential(
        *(nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU()) for _ in range(4)), nn.Linear(WIDTH, 10)
    )
    optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-3)
    return (DistributedDataParallel(model) if wrap else model), optimizer


def _everyone(fits: bool) -> bool:
    outcomes: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(outcomes, fits)
    return all(outcomes)


def zero_trains_capped(size: int, budget_bytes: int) -> bool:
    """Whether every rank trains 2 steps of a fresh ``zero_mlp`` at ``size`` under ``budget_bytes``,
    with DDP's gradient all-reduce and ZeRO's broadcast, the DDP built inside the cap. The ranks'
    shares of AdamW's state differ, so one rank can run out of memory where the other goes on into
    a collective: each collective runs once every rank is known to have got there (the gradients
    all-reduced in place after a backward in ``no_sync``, as DDP's buckets would; ZeRO's step split
    where its broadcast, in place too, begins). None of them allocates."""
    model, optimizer = zero_mlp(wrap=False)
    zero: Any = optimizer
    batch = make_batch(size)
    with cap_memory(budget_bytes, resident=[model, optimizer]):
        network = DistributedDataParallel(model)
        for _ in range(2):
            fits = True
            try:
                inputs, target = (tensor.clone() for tensor in batch)
                optimizer.zero_grad(set_to_none=True)
                with network.no_sync():
                    nn.functional.cross_entropy(network(inputs), target).backward()
                del inputs, target
            except torch.OutOfMemoryError:
                fits = False
            if not _everyone(fits):
                return False
            for parameter in model.parameters():
                dist.all_reduce(parameter.grad)
                parameter.grad.div_(dist.get_world_size())
            try:
                zero._local_step()
            except torch.OutOfMemoryError:
                fits = False
            if not _everyone(fits):
                return False
            zero._sync_params()
    return True


def zero_search_report(limit: str) -> dict[str, Any]:
    """find on ``zero_mlp`` under ``limit``, where the ranks' shards of AdamW's state differ and
    some trials run out of memory; the answer and the next size trained by force."""
    model, optimizer = zero_mlp()
    workload = Workload(model, optimizer, make_batch=make_batch, loss_fn=nn.functional.cross_entropy)
    found = find_batch_size(workload, device="cpu", memory_limit=limit, sizes=BatchSizes(max_batch_size=4096))
    return {
        "batch_size": found.batch_size,
        "trials": [[trial.batch_size, trial.outcome] for trial in found.trials],
        "by_force": [
            zero_trains_capped(size, found.budget_bytes) for size in (found.batch_size, found.batch_size + 1)
        ],
    }


def zero_report() -> dict[str, Any]:
    """find on an MLP in DDP whose AdamW is sharded by ``ZeroRedundancyOptimizer``, after one real
    step (so each rank's local optimizer holds state for its shard): whether that state is as it
    was, and the bytes batchfit counts for the optimizer beside the local state's."""
    model, optimizer = zero_mlp()
    zero: Any = optimizer
    inputs, target = make_batch(8)
    nn.functional.cross_entropy(model(inputs), target).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    local = zero.optim.state
    before = {id(key): {name: value.clone() for name, value in state.items()} for key, state in local.items()}
    workload = Workload(model, optimizer, make_batch=make_batch, loss_fn=nn.functional.cross_entropy)
    tracker = StorageTracker()
    tracker.track(resident_tensors(optimizer))
    counted = tracker.live_bytes
    find_batch_size(workload, device="cpu", memory_limit="1GiB", sizes=BatchSizes(max_batch_size=64))
    restored = {id(key) for key in local} == set(before) and all(
        torch.equal(value, before[id(key)][name])
        for key, state in local.items()
        for name, value in state.items()
    )
    return {
        "restored": restored,
        "local_parameters": len(local),
        "counted_bytes": counted,
        "local_bytes": sum(v.numel() * v.element_size() for state in local.values() for v in state.values()),
    }


def main(rank: int, world_size: int, store: str, limit: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{store}", rank=rank, world_size=world_size, timeout=timedelta(seconds=60)
    )
    report_and_leave(
        out,
        rank,
        lambda: {
            "fsdp": {**report(limit), "older_torch": older_torch_report(limit)} if FULLY_SHARD else None,
            "zero": zero_report(),
            "zero_search": zero_search_report("8MiB"),
        },
    )

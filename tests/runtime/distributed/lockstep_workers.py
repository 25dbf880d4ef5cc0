"""The ranks of the lockstep tests: each a real process in a real gloo group (spawned by
test_lockstep.py), searching a tiny MLP on a capped CPU that plays its own device."""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import inspect
import logging
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from tiny_workloads import build, classification_batch, large_batch_workspace
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from two_ranks import report_and_leave

from batchfit import (
    BatchSizes,
    ConfigurationError,
    DoesNotFitError,
    Goal,
    Timing,
    Workload,
    analyze,
    cap_memory,
    compare,
    explore,
    find_batch_size,
)
from batchfit.runtime.devices.caching_device import CachingCpuDevice
from batchfit.runtime.devices.tracker import StorageTracker
from batchfit.runtime.distributed.data_parallel import bucket_bytes
from batchfit.search.find_batch_size import find_on
from batchfit.units import parse_bytes
from batchfit.where import ResolvedDevice


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
    elif scenario == "caching-revised":
        return revised_report(limits[rank])
    elif scenario == "ddp":
        return ddp_report(limits[rank])
    elif scenario == "ddp-cuda":
        return ddp_cuda_report(limits[rank])
    else:
        raise ValueError(scenario)
    result = find_batch_size(
        workload, device="cpu", memory_limit=limits[rank], sizes=BatchSizes(max_batch_size=4096)
    )
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
    result = find_on(
        ResolvedDevice(CachingCpuDevice(parse_bytes(limit)), 0.8),
        workload,
        "train",
        sizes=BatchSizes(max_batch_size=4096),
    )
    return {
        "batch_size": result.batch_size,
        "trials": [trial.batch_size for trial in result.trials],
        "outcomes": [trial.outcome for trial in result.trials],
        "replays": result.replays,
    }


def revised_report(limit: str) -> dict[str, Any]:
    """find on the CPU with CUDA's caching allocator modelled, the MLP whose step takes a workspace
    from 64 samples up: the replay's forecast overshoots and is asked again, on every rank alike."""
    result = find_on(
        ResolvedDevice(CachingCpuDevice(parse_bytes(limit)), 0.8),
        large_batch_workspace(1500),
        "train",
        BatchSizes(max_batch_size=8192),
    )
    return {"batch_size": result.batch_size, "trials": [trial.batch_size for trial in result.trials]}


def ddp_report(limit: str) -> dict[str, Any]:
    """find on the MLP wrapped in DistributedDataParallel and unwrapped, on the capped CPU (the DDP
    answer trained by force in DDP with its all-reduces, on every rank) and with CUDA's allocator
    modelled (beside the MLP holding a tensor of the buckets' bytes). Also the peak of DDP training
    under ``cap_memory``, the DDP built inside and named among the resident; batchfit's count of
    DDP's buckets beside what DDP allocates, on modules that test its rules; and what a compiled
    DDP is told."""
    plain = build("mlp", "adam")
    wrapped = dataclasses.replace(plain, model=DistributedDataParallel(plain.model))
    told: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: told.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("batchfit.runtime.distributed.data_parallel").addHandler(handler)
    found = find_batch_size(wrapped, device="cpu", memory_limit=limit, sizes=BatchSizes(max_batch_size=4096))
    unwrapped = find_batch_size(
        plain, device="cpu", memory_limit=limit, sizes=BatchSizes(max_batch_size=4096)
    )
    # Behind the modelled caching allocator (2 MiB segments: a 4 MiB device holds one of them),
    # DDP's buckets are a block held from trial to trial, as a tensor of their bytes allocated
    # before the search would be (here a buffer the loss reaches, resident in every trial).
    caching = parse_bytes("6MiB")
    behind = find_on(
        ResolvedDevice(CachingCpuDevice(caching), 0.8),
        wrapped,
        "train",
        sizes=BatchSizes(max_batch_size=4096),
    )
    holder = nn.Module()
    holder.register_buffer("buckets", torch.empty(wrapped.wrapper_bytes, dtype=torch.uint8))

    def loss_fn(output: torch.Tensor, target: torch.Tensor, holder: nn.Module = holder) -> torch.Tensor:
        return nn.functional.cross_entropy(output, target)

    held = dataclasses.replace(plain, loss_fn=loss_fn)
    behind_held = find_on(
        ResolvedDevice(CachingCpuDevice(caching), 0.8), held, "train", sizes=BatchSizes(max_batch_size=4096)
    )
    behind_plain = find_on(
        ResolvedDevice(CachingCpuDevice(caching), 0.8), plain, "train", sizes=BatchSizes(max_batch_size=4096)
    )
    try:
        Workload(torch.compile(wrapped.model), make_batch=plain.make_batch)
        refused = ""
    except ConfigurationError as error:
        refused = str(error)
    try:
        find_batch_size(wrapped, device="cpu", memory_limit="1MiB")
        too_small = ""
    except DoesNotFitError as error:
        too_small = str(error)
    # A train_step written for DDP: it accumulates over two micro-batches, all-reducing the
    # gradients only at the last (DDP's no_sync), and reads the module through model.module.
    accumulating = dataclasses.replace(wrapped, loss_fn=None, train_step=accumulating_step)
    accumulated = find_batch_size(
        accumulating, device="cpu", memory_limit=limit, sizes=BatchSizes(max_batch_size=4096)
    )
    return {
        "accumulated": [
            accumulated.batch_size,
            *(
                _ddp_trains_capped(size, accumulated.budget_bytes, accumulating_step)
                for size in (accumulated.batch_size, accumulated.batch_size + 1)
            ),
        ],
        "batch_size": found.batch_size,
        "unwrapped_batch_size": unwrapped.batch_size,
        "trials": [trial.batch_size for trial in found.trials],
        "by_force": [
            _ddp_trains_capped(size, found.budget_bytes) for size in (found.batch_size, found.batch_size + 1)
        ],
        "caching": [
            [trial.batch_size for trial in result.trials] for result in (behind, behind_held, behind_plain)
        ],
        "peaks": [_ddp_peak(found.batch_size, built_inside) for built_inside in (True, False)],
        "buckets": [
            [bucket_bytes(DistributedDataParallel(module)), _ddp_allocates(module)]
            for module in _bucket_cases()
        ],
        "refused": refused,
        "told": told,
        "summary": found.summary(),
        "wrapper_bytes": found.to_dict()["wrapper_bytes"],
        "too_small": too_small,
        "replaced": [
            wrapped.replaced(model=plain.model).wrapper_bytes,  # a fake or compiled copy of the module
            plain.replaced(model=wrapped.model).wrapper_bytes,  # a wrapper of its own
        ],
    }


def accumulating_step(model: nn.Module, optimizer: torch.optim.Optimizer, batch: Any) -> None:
    """One optimizer step over two micro-batches, DDP's way: the first backward in ``no_sync``, the
    gradients all-reduced at the last; ``model.module`` as a DDP user reaches the module."""
    inputs, target = batch
    optimizer.zero_grad(set_to_none=True)
    halves = list(zip(inputs.chunk(2), target.chunk(2), strict=True))
    for index, (micro_inputs, micro_target) in enumerate(halves):
        with model.no_sync() if index < len(halves) - 1 else contextlib.nullcontext():
            loss = nn.functional.cross_entropy(model(micro_inputs), micro_target) / len(halves)
            loss.backward()
    assert isinstance(model.module, nn.Sequential)
    optimizer.step()


def _ddp_trains_capped(
    size: int,
    budget_bytes: int,
    step: Callable[[nn.Module, torch.optim.Optimizer, Any], None] | None = None,
) -> bool:
    """Whether every rank trains 2 steps of a fresh MLP in DDP at ``size`` under a cap at
    ``budget_bytes`` on the CPU (with ``step``, each batch a copy held to the step's end), the DDP
    built inside the cap: its buckets are among the block's own allocations."""
    model, optimizer, make_batch = _fresh()
    batch = make_batch(size)
    try:
        with cap_memory(budget_bytes, resident=[model, optimizer]):
            network = DistributedDataParallel(model)
            if step is None:
                _train(network, optimizer, batch, 2)
            else:
                for _ in range(2):
                    copies = tuple(tensor.clone() for tensor in batch)
                    step(network, optimizer, copies)
                    del copies
        fits = True
    except torch.OutOfMemoryError:
        fits = False
    return _everyone(fits)


def _ddp_peak(size: int, built_inside: bool) -> int:
    """The peak of 2 DDP training steps at ``size`` inside ``cap_memory`` (no cap reached): the DDP
    built inside the block, or built before it (and named among its ``resident``)."""
    model, optimizer, make_batch = _fresh()
    batch = make_batch(size)
    network = None if built_inside else DistributedDataParallel(model)
    with cap_memory("1GiB", resident=[network or model, optimizer]) as measurement:
        _train(network or DistributedDataParallel(model), optimizer, batch, 2)
    return measurement.peak_bytes


def ddp_cuda_report(limit: str) -> dict[str, Any]:
    """On CUDA (both ranks on cuda:0, gloo between them): find on an MLP of wide layers wrapped in
    DDP and unwrapped, and the DDP answer trained 10 steps by force in DDP under the search's
    budget. CUDA's allocator holds DDP's one bucket already; the trials rebuild it into the buckets
    DDP rebuilds it into in step 2, placed beside it (``runtime.distributed.buckets``)."""
    torch.manual_seed(0)
    device = torch.device("cuda", 0)
    model = nn.Sequential(*(nn.Linear(2048, 2048) for _ in range(4)), nn.Linear(2048, 10)).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def make_batch(size: int) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(size)
        return torch.randn(size, 2048, generator=generator), torch.randint(
            0, 10, (size,), generator=generator
        )

    plain = Workload(model, optimizer, make_batch=make_batch, loss_fn=nn.functional.cross_entropy)
    # Unwrapped first: on a GPU a DDP's buckets, once built, are memory any search sees.
    unwrapped = find_batch_size(
        plain, device="cuda:0", memory_limit=limit, sizes=BatchSizes(max_batch_size=65536)
    )
    wrapped = dataclasses.replace(plain, model=DistributedDataParallel(model, device_ids=[0]))
    found = find_batch_size(
        wrapped, device="cuda:0", memory_limit=limit, sizes=BatchSizes(max_batch_size=65536)
    )
    wrapper_bytes = wrapped.wrapper_bytes
    del wrapped  # its buckets go with it: the DDP trained by force holds its own
    gc.collect()
    torch.cuda.empty_cache()

    def trains(size: int, how: str = "ddp") -> tuple[bool, dict[str, Any]]:
        """Whether 10 steps at ``size`` train by force under the search's budget on every rank,
        and what this rank saw of its allocator. ``how``: "ddp", the DDP built before the cap, as
        a user builds it before calling find (the cap empties the cache its construction left, as
        find's first trial does); "ddp-inside", built inside the cap, where the blocks its
        construction freed (the parameters flattened for the broadcast from rank 0) stay cached
        for the steps to split; "unwrapped", the plain model beside a tensor of the buckets' bytes
        (what the search's trials hold)."""
        seen: dict[str, Any] = {}
        batch = make_batch(size)  # on the host, outside the cap, as a data loader makes it
        network: nn.Module | None = DistributedDataParallel(model, device_ids=[0]) if how == "ddp" else None
        try:
            with cap_memory(found.budget_bytes, resident=[model, optimizer], device=device):
                held = None
                if how == "unwrapped":
                    held = torch.empty(wrapper_bytes, dtype=torch.uint8, device=device)
                if how == "ddp-inside":
                    network = DistributedDataParallel(model, device_ids=[0])
                _train(network or model, optimizer, batch, 10, device, seen)
                del held
            fits = True
        except torch.OutOfMemoryError as error:
            fits, seen["failure"] = False, str(error).splitlines()[0][:300]
        if isinstance(network, DistributedDataParallel):  # what DDP rebuilt its buckets into
            seen["rebuilt"] = str(network._get_ddp_logging_data().get("rebuilt_bucket_sizes", ""))
        network = None
        optimizer.state.clear()
        model.zero_grad(set_to_none=True)
        gc.collect()
        torch.cuda.empty_cache()
        return _everyone(fits), seen

    fits, seen = trains(found.batch_size)
    inside, seen_inside = trains(found.batch_size, "ddp-inside")
    report: dict[str, Any] = {
        "batch_size": found.batch_size,
        "unwrapped_batch_size": unwrapped.batch_size,
        "wrapper_bytes": wrapper_bytes,
        "by_force": fits,
        # Built inside the cap, as this test built it until 2026-11-26, when the answer (3584 on an
        # H200) did not train in either (DDP's own largest: 3328).
        "by_force_built_inside": inside,
        "steps_seen": {"ddp": seen, "ddp-inside": seen_inside},
        "rebuilt_buckets": ", ".join(str(size) for size in found.rebuilt_buckets),
        "summary": found.summary(),
    }
    if not fits:  # what the next GPU run needs to tell why
        answer = [trial for trial in found.trials if trial.batch_size == found.batch_size][-1]
        low, high = found.batch_size // 2, found.batch_size  # DDP's own largest, by bisection
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (middle, high) if trains(middle)[0] else (low, middle)
        report["diagnosis"] = {
            "budget_bytes": found.budget_bytes,
            "trials": [(t.batch_size, t.outcome, t.peak_bytes, t.reserved_peak_bytes) for t in found.trials],
            "answer_peaks": (answer.peak_bytes, answer.reserved_peak_bytes),
            "ddp_by_force": seen,
            "unwrapped_beside_buckets_by_force": trains(found.batch_size, "unwrapped"),
            "ddp_truth": low,
            "ddp_truth_by_force": trains(low)[1],
        }
    return report


def _fresh() -> tuple[nn.Module, torch.optim.Optimizer, Callable[[int], Any]]:
    """A fresh copy of the MLP, its Adam and its batches (the search's own were put back as they were)."""
    fresh = build("mlp", "adam")
    assert isinstance(fresh.optimizer, torch.optim.Optimizer) and fresh.make_batch is not None
    return fresh.model, fresh.optimizer, fresh.make_batch


def _train(
    network: nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: Any,
    steps: int,
    device: str | torch.device = "cpu",
    seen: dict[str, Any] | None = None,
) -> None:
    """``steps`` training steps, each on a copy of ``batch`` on ``device`` held to the step's end,
    as a training loop holds the batch it copied (``batch`` is made on the host outside any cap, as
    a data loader makes it; the search's trials do the same). On CUDA, ``seen`` takes each step's
    allocated and reserved peaks, and the steps that ran."""
    cuda = torch.device(device).type == "cuda"
    for step in range(steps):
        if seen is not None and cuda:
            torch.cuda.reset_peak_memory_stats(device)
        inputs, target = (tensor.to(device, copy=True) for tensor in batch)
        optimizer.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(network(inputs), target).backward()
        optimizer.step()
        del inputs, target
        if seen is not None and cuda:
            seen["steps"] = step + 1
            peaks = (torch.cuda.max_memory_allocated(device), torch.cuda.max_memory_reserved(device))
            seen.setdefault("peaks", []).append(peaks)


def _everyone(fits: bool) -> bool:
    """Whether it fitted on every rank (so all return the same)."""
    outcomes: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(outcomes, fits)
    return all(outcomes)


def _bucket_cases() -> list[nn.Module]:
    """Modules whose DDP buckets test DDP's rules: a frozen layer, a tied weight, a sparse
    embedding, a half-precision layer; and the same with two parameters DDP is told to ignore."""

    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(50, 16)
            self.sparse = nn.Embedding(40, 8, sparse=True)
            self.frozen = nn.Linear(16, 16).requires_grad_(False)
            self.half = nn.Linear(16, 4).half()
            self.head = nn.Linear(16, 50, bias=False)
            self.head.weight = self.embed.weight
            self.scale = nn.Parameter(torch.ones(3))

    ignored = Tied()
    ignored._ddp_params_and_buffers_to_ignore = [".scale", "half.bias"]  # DDP's names for them
    return [Tied(), ignored]


def _ddp_allocates(module: nn.Module) -> int | None:
    """The bytes a DDP of ``module`` holds for its life: counted while it is built, and freed with
    it (None on a torch whose DDP cannot be built without its broadcast: before 2.5)."""
    if "init_sync" not in inspect.signature(DistributedDataParallel.__init__).parameters:
        return None
    tracker = StorageTracker()
    with tracker:
        # Without the broadcast of the module's state, whose small tensors the tracker counts or not
        # as gloo's thread or this one makes them: what is left is the reducer's own.
        wrapped = DistributedDataParallel(module, init_sync=False)
        held = tracker.live_bytes
        del wrapped
        gc.collect()
    return held - tracker.live_bytes


def explore_report(workload: Workload, limit: str) -> dict[str, Any]:
    """explore on the capped CPU up to the memory-safe maximum, briefly."""
    result = explore(
        workload,
        device="cpu",
        memory_limit=limit,
        timing=Timing(time_budget_seconds=3),
        goal=Goal(confidence_target=80),
    )
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
        sizes=BatchSizes(global_batch_size=64),
        timing=Timing(windows=1, time_budget_seconds=0, time_slow=True),
    )
    return {"rows": [dataclasses.asdict(row) for row in result.rows]}


def main(rank: int, world_size: int, store: str, scenario: str, limits: list[str], out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{store}", rank=rank, world_size=world_size, timeout=timedelta(seconds=60)
    )
    report_and_leave(out, rank, lambda: run(rank, scenario, limits))

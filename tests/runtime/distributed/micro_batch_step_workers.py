"""The ranks of the MicroBatchStep DDP tests: each a real process in a real gloo group (spawned by
test_micro_batch_step_ddp.py), training the same tiny DDP model on its own share of the batches."""

from __future__ import annotations

import json
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from micro_batch_helpers import adam, make_batch, make_model
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from two_ranks import counting_ddp, leave_group

import batchfit
from batchfit import MicroBatchOptions, MicroBatchStep
from batchfit.runtime.distributed.gradients import GradientAverage, gradient_mask

SAMPLES_PER_RANK = 200


def rank_batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s share of global batch ``step`` (the test concatenates the shares)."""
    return make_batch(SAMPLES_PER_RANK, seed=10 * step + rank)


def out_of_memory_on_one_rank(rank: int, cap: int, out: Path) -> dict[str, Any]:
    """Step 0 with rank 1 under ``cap`` (it runs out of memory in backward at 64), then step 1 uncapped."""
    model, ddp_allreduces = counting_ddp(make_model())
    optimizer = adam(model)
    step = MicroBatchStep(model, optimizer, loss_fn=nn.functional.cross_entropy, micro_batch_size=64)
    started = time.perf_counter()
    if rank == 1:
        with batchfit.cap_memory(cap, resident=[model, optimizer]):
            losses = [step(rank_batch(0, rank)).item()]
    else:
        losses = [step(rank_batch(0, rank)).item()]
    losses.append(step(rank_batch(1, rank)).item())
    torch.save(model.module.state_dict(), out / f"weights{rank}.pt")
    return {
        "seconds": time.perf_counter() - started,
        "micro_batch_size": step.micro_batch_size,
        "history": [change.to_dict() for change in step.history],
        "losses": losses,
        "ddp_allreduces": ddp_allreduces[0],
        "optimizer_steps": [float(state["step"]) for state in optimizer.state.values()],
        "gradients_left": sum(param.grad is not None for param in model.parameters()),
    }


def error_on_one_rank(rank: int) -> dict[str, Any]:
    """Rank 1's loss raises in its second micro-batch; rank 0's runs on."""
    model = DistributedDataParallel(make_model())
    calls = [0]

    def compute_loss(model: nn.Module, micro_batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        calls[0] += 1
        if rank == 1 and calls[0] == 2:
            raise ValueError("a bug in rank 1's loss")
        return nn.functional.cross_entropy(model(micro_batch[0]), micro_batch[1])

    step = MicroBatchStep(model, adam(model), compute_loss=compute_loss, micro_batch_size=64)
    started = time.perf_counter()
    try:
        step(rank_batch(0, rank))
    except Exception as error:
        return {
            "seconds": time.perf_counter() - started,
            "error": type(error).__name__,
            "message": str(error),
            "notes": getattr(error, "__notes__", []),
            "calls": calls[0],
            "gradients_left": sum(param.grad is not None for param in model.parameters()),
        }
    return {"error": None}


def non_finite_on_one_rank(rank: int) -> dict[str, Any]:
    """Rank 1's sample 70 is NaN (its micro-batch 2 of 4 at 64): both ranks raise; then, skipping,
    both skip that batch and step together on the next."""

    def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        inputs, targets = rank_batch(step, rank)
        if rank == 1 and step == 0:
            inputs[70] = float("nan")
        return inputs, targets

    model = DistributedDataParallel(make_model())
    step = MicroBatchStep(model, adam(model), loss_fn=nn.functional.cross_entropy, micro_batch_size=64)
    try:
        step(batch(0))
        raised = None
    except Exception as error:
        raised = f"{type(error).__name__}: {error}"
    skipping = MicroBatchStep(
        model,
        adam(model),
        loss_fn=nn.functional.cross_entropy,
        micro_batch_size=64,
        options=MicroBatchOptions(non_finite="skip"),
    )
    skipping(batch(0))
    skipped = (skipping.skipped_steps, skipping.optimizer_steps)
    skipping(batch(1))
    return {
        "raised": raised,
        "skipped": skipped,
        "after": (skipping.skipped_steps, skipping.optimizer_steps),
        "weights": [param.detach().sum().item() for param in model.parameters()],
    }


def gradient_average(rank: int) -> dict[str, Any]:
    """GradientAverage alone, with buckets of 8 float64 (64 bytes): two small gradients share a bucket,
    a third takes another, a large one is reduced in place, a float32 one has its own buffer; one
    gradient exists on rank 0 only, one on no rank."""
    shapes = [(3,), (5,), (40,), (4,), (2,)]
    parameters = [nn.Parameter(torch.zeros(shape, dtype=torch.float64)) for shape in shapes]
    parameters.append(nn.Parameter(torch.zeros(3, dtype=torch.float32)))
    for index, parameter in enumerate(parameters):
        if index == 4 or (index == 3 and rank == 1):
            continue
        parameter.grad = torch.arange(parameter.numel(), dtype=parameter.dtype) * (rank + 1) + index
    masks: list[Any] = [None, None]
    dist.all_gather_object(masks, gradient_mask(parameters))
    average = GradientAverage(parameters, masks, bucket_bytes=64)
    average.all_reduce(None, 2)
    return {
        "buffer_bytes": average.buffer_bytes,
        "gradients": [None if p.grad is None else p.grad.tolist() for p in parameters],
    }


def main(rank: int, world_size: int, store: str, cap: int, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{store}", rank=rank, world_size=world_size, timeout=timedelta(seconds=60)
    )
    report: dict[str, Any] = {}
    for name, scenario in (
        ("out_of_memory", lambda: out_of_memory_on_one_rank(rank, cap, Path(out))),
        ("error", lambda: error_on_one_rank(rank)),
        ("non_finite", lambda: non_finite_on_one_rank(rank)),
        ("average", lambda: gradient_average(rank)),
    ):
        try:
            report[name] = scenario()
        except BaseException as error:
            report[name] = {"unexpected": f"{type(error).__name__}: {error}"}
            break
    Path(out, f"{rank}.json").write_text(json.dumps(report))
    leave_group()

"""What the CPU adds when it stands in alone for CUDA in ``predict --device cpu``, and what it
cannot show: each part modelled is named in the prediction, and each part not modelled widens its
band by a guessed share of the budget."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from batchfit.policy.capacity.capacity_prediction import Unmodelled
from batchfit.runtime.steps.attention import CudaAttention
from batchfit.runtime.steps.reach import grad_scalers
from batchfit.runtime.workloads.workload import Workload

#: The CPU alone: the share of the budget each part the CPU cannot model may move the step's
#: memory by, either way. Guesses, not measurements, until a GPU session measures them.
GUESSED_SHARES = {
    "cudnn": 0.03,
    "attention": 0.10,
    "autocast": 0.25,
}
#: The attention kernel, where the trace did not run it as CUDA's fused kernel.
ATTENTION_PART = "the attention kernel CUDA picks (flash, memory-efficient or math)"


@contextmanager
def cuda_defaults(optimizer: Any, on: bool = True) -> Iterator[None]:
    """On the CPU standing in for CUDA, ``optimizer`` steps as it defaults to on CUDA (foreach,
    where its ``foreach`` is unset and it is not fused): the step's temporaries are CUDA's."""
    changed = []
    if on and isinstance(optimizer, torch.optim.Optimizer) and "foreach" in optimizer.defaults:
        changed = [g for g in optimizer.param_groups if g.get("foreach") is None and not g.get("fused")]
    for group in changed:
        group["foreach"] = True
    try:
        yield
    finally:
        for group in changed:
            group["foreach"] = None


def unmodelled(workload: Workload, attention: CudaAttention) -> tuple[Unmodelled, ...]:
    """What the CPU cannot show of the step on CUDA, each with its guessed share of the budget
    (attention's where the trace did not run every attention call as a fused kernel)."""
    modules = list(workload.module.modules())
    found = []
    if any(isinstance(module, torch.nn.modules.conv._ConvNd) for module in modules):
        found.append(("cuDNN's convolution workspaces (the algorithm CUDA picks)", "cudnn"))
    if any("attention" in type(module).__name__.lower() for module in modules) and not (
        attention.all_fused(workload.module)
    ):
        found.append((ATTENTION_PART, "attention"))
    if grad_scalers(workload.train_step, workload.eval_step):
        found.append(("autocast to float16 with a GradScaler (run as the CPU runs it)", "autocast"))
    return tuple(Unmodelled(part, GUESSED_SHARES[key]) for part, key in found)


def modelled(cpu_alone: bool, workload: Workload, unmodelled: tuple[Unmodelled, ...]) -> tuple[str, ...]:
    if not cpu_alone:
        return ("every request the local GPU's allocator served, cuBLAS's and cuDNN's workspaces included",)
    parts = [
        "CUDA's caching allocator (rounding, pools, segments, splitting, retries) on the step's own tensors",
        "cuBLAS's two workspaces, kept from the first matrix products (32 MiB each on Hopper, 8.125 before)",
        "the CUDA context, by card (policy.capacity.cards: an estimate with its range)",
    ]
    optimizer = workload.optimizer if isinstance(workload.optimizer, torch.optim.Optimizer) else None
    if optimizer is not None and "foreach" in optimizer.defaults:
        parts.append("the optimizer's foreach step, CUDA's default (unless set otherwise)")
    attention = any("attention" in type(module).__name__.lower() for module in workload.module.modules())
    if attention and ATTENTION_PART not in [each.part for each in unmodelled]:
        parts.append("attention as CUDA's fused kernel allocates (flash or memory-efficient, as sm80+ picks)")
    return tuple(parts)

"""Targets for ``batchfit find --workload workloads_for_cli:FUNCTION`` in test_cli.py.

The CLI imports this module from its working directory (tests/), so it must stay importable on
its own: torch and batchfit only.
"""

from __future__ import annotations

import torch
from torch import nn

import batchfit

#: Not a function: ``--workload workloads_for_cli:NOT_CALLABLE`` must be refused.
NOT_CALLABLE = 3


def tiny() -> batchfit.Workload:
    """A 32-64-4 perceptron with SGD: a few KiB of weights, 32 floats per sample."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))

    def make_batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(n)
        return torch.randn(n, 32, generator=generator), torch.randint(0, 4, (n,), generator=generator)

    return batchfit.Workload(
        model=model,
        optimizer=lambda params: torch.optim.SGD(params, lr=0.1),
        make_batch=make_batch,
        loss_fn=nn.functional.cross_entropy,
        name="tiny-from-tests",
    )


def compiled_tiny() -> batchfit.Workload:
    """``tiny`` with its model compiled (``torch.compile``): measured from the allocator's events."""
    workload = tiny()
    workload.model = torch.compile(workload.model)  # type: ignore[assignment]
    workload.name = "compiled-tiny"
    return workload


def not_a_workload() -> dict[str, int]:
    """Returns something else than a Workload."""
    return {"batch_size": 8}


def tiny_on(device: torch.device) -> batchfit.Workload:
    """``tiny`` built on the device batchfit passes (a function with a ``device`` parameter)."""
    workload = tiny()
    workload.model.to(device)
    workload.name = f"tiny-on-{device.type}"
    return workload


def fails_on_rank_1() -> batchfit.Workload:
    """``tiny``, whose train step raises ValueError on rank 1 of a process group (torchrun tests)."""
    workload = tiny()

    def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, batch: object) -> None:
        if torch.distributed.is_initialized() and torch.distributed.get_rank() == 1:
            raise ValueError("a bug in rank 1's train step")
        inputs, target = batch  # type: ignore[misc]
        optimizer.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(inputs), target).backward()
        optimizer.step()

    workload.train_step = train_step
    return workload


def needs_arguments(size: int) -> batchfit.Workload:
    """A factory batchfit cannot call: it needs an argument."""
    raise AssertionError("batchfit must not call a factory that needs arguments")


def tiny_on_meta() -> batchfit.Workload:
    """``tiny`` with its model built on the meta device: shapes, no memory (what batchfit's advice
    sends to ``predict --device cpu``)."""
    workload = tiny()
    with torch.device("meta"):
        workload.model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
    workload.name = "tiny-on-meta"
    return workload

"""Child process of test_rlimit.py: a batch-size search under a real RLIMIT_AS, then training at it.

Usage: ``python rlimit_child.py HEADROOM_MIB STEPS FRACTION``. After torch is imported and the
model built, the address space is capped at the current VmSize + HEADROOM_MIB, so the CPU
allocator itself fails (``DefaultCPUAllocator: can't allocate memory``) when a batch is too
large. No ``memory_limit`` is passed: the CPU device's capacity comes from the RLIMIT_AS headroom.
Then STEPS training steps run at the answer, on fresh batches, with the same model and optimizer.
Prints one JSON line: the search result with its trials, and how the training went.
"""

from __future__ import annotations

import json
import math
import resource
import sys
from typing import Any

import torch
from torch import nn

import batchfit
from batchfit import BatchSizes

#: Features per sample: one sample is 1 MiB of float32, and so is each of its activations.
FEATURES = 2**18
MiB = 2**20


def vm_size_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize in /proc/self/status")


class Wide(nn.Module):
    """Few parameters (2 MiB), wide elementwise activations: ~5 MiB of tensors per sample in a
    training step, and little compute, so a batch of ~20 already fills a 128 MiB headroom."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(FEATURES))
        self.shift = nn.Parameter(torch.zeros(FEATURES))
        self.head = nn.Linear(64, 10)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        hidden = torch.tanh(inputs * self.scale + self.shift)
        hidden = torch.tanh(hidden * self.scale)
        return self.head(hidden.view(hidden.shape[0], 64, -1).mean(-1))  # type: ignore[no-any-return]


def make_batch(n: int, seed: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(n if seed is None else seed)
    return torch.randn(n, FEATURES, generator=generator), torch.randint(0, 10, (n,), generator=generator)


def main() -> None:
    headroom, steps, fraction = int(sys.argv[1]) * MiB, int(sys.argv[2]), float(sys.argv[3])
    torch.manual_seed(0)
    model = Wide()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    workload = batchfit.Workload(
        model=model,
        optimizer=optimizer,
        make_batch=make_batch,
        loss_fn=nn.functional.cross_entropy,
        name="wide",
    )
    initial = [parameter.detach().clone() for parameter in model.parameters()]

    # What a CUDA build of torch starts lazily (the driver's device count, autograd's worker
    # threads) starts here, before the cap: the cap is for the search's tensors. On an H100 machine
    # both failed inside it ("out of memory" from cudaGetDeviceCount, "Resource temporarily
    # unavailable" at the first backward). A CPU-only build starts none of it.
    torch.cuda.is_available()
    warm = torch.ones(2, requires_grad=True)
    (warm * 2).sum().backward()
    del warm
    vm_before = vm_size_bytes()
    limit = vm_before + headroom
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    # The limit is real: an allocation of twice the headroom fails in the CPU allocator itself.
    try:
        torch.empty(2 * headroom // 4, dtype=torch.float32)
        probe = "allocated"
    except RuntimeError as error:
        probe = str(error)

    result = batchfit.find_batch_size(
        workload, "train", device="cpu", memory_fraction=fraction, sizes=BatchSizes(max_batch_size=100_000)
    )
    vm_after_search = vm_size_bytes()

    # Train at the answer: fresh batches, the same model and optimizer, no batchfit in the way.
    losses: list[float] = []
    train_error = None
    try:
        for step in range(steps):
            inputs, target = make_batch(result.batch_size, seed=10_000 + step)
            optimizer.zero_grad(set_to_none=True)
            loss = nn.functional.cross_entropy(model(inputs), target)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            del inputs, target, loss
    except (RuntimeError, MemoryError) as error:
        train_error = f"{type(error).__name__}: {str(error).strip().splitlines()[0]}"

    report: dict[str, Any] = {
        "rlimit_as": resource.getrlimit(resource.RLIMIT_AS)[0],
        "vm_before": vm_before,
        "headroom": headroom,
        "parameter_bytes": sum(p.untyped_storage().nbytes() for p in model.parameters()),
        "probe": probe,
        "result": result.to_dict(),
        "vm_after_search": vm_after_search,
        "vm_after_training": vm_size_bytes(),
        "train_error": train_error,
        "losses": losses,
        "losses_finite": all(math.isfinite(value) for value in losses),
        "parameters_changed": any(
            not torch.equal(old, new) for old, new in zip(initial, model.parameters(), strict=True)
        ),
    }
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()

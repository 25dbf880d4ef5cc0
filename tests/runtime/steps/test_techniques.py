"""Techniques applied to real tiny models, and put back: checkpointing recomputes the blocks,
autocast runs them in bfloat16 (or float16 with a GradScaler), accumulation equals one step,
cuDNN's flag comes back."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from typing import Any

import pytest
import torch
from torch import nn

from batchfit import Workload
from batchfit.runtime.steps.reach import grad_scalers
from batchfit.runtime.steps.techniques import applied, module_blocks

CPU = torch.device("cpu")


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)
        self.calls = 0
        self.dtypes: list[torch.dtype] = []

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        output = torch.relu(self.linear(inputs))
        self.dtypes.append(output.dtype)
        return output


def workload() -> Workload:
    torch.manual_seed(0)
    model = nn.Sequential(Block(), Block(), nn.Linear(8, 2))

    def make_batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(n)
        return torch.randn(n, 8, generator=generator), torch.randint(0, 2, (n,), generator=generator)

    return Workload(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        make_batch=make_batch,
        loss_fn=nn.functional.cross_entropy,
    )


def step(variant: Workload, batch: Any) -> None:
    variant.run_train_step(variant.build_optimizer(), batch)


def test_the_blocks_are_found_among_the_modules() -> None:
    blocks = module_blocks(workload().model)
    assert [name for name, block in blocks if block] == ["Block", "Block"]


def test_checkpointing_recomputes_each_block_and_is_put_back() -> None:
    original = workload()
    blocks = [module for module in original.model.modules() if isinstance(module, Block)]
    with applied(original, ("checkpointing",), CPU, block="Block") as (variant, how):
        assert how == "checkpointing 2 Block blocks"
        step(variant, variant.host_batch(4))
        assert [block.calls for block in blocks] == [2, 2]  # forward, then again in backward
    assert all("forward" not in vars(block) for block in blocks)
    step(original, original.host_batch(4))
    assert [block.calls for block in blocks] == [3, 3]


def test_amp_runs_the_step_in_bfloat16_on_the_cpu_and_leaves_the_workload_alone() -> None:
    original = workload()
    block = original.model[0]
    with applied(original, ("amp",), CPU) as (variant, how):
        assert how == "autocast bfloat16"
        assert variant.train_step is not None and original.train_step is None
        step(variant, variant.host_batch(4))
    assert block.dtypes == [torch.bfloat16]
    step(original, original.host_batch(4))
    assert block.dtypes == [torch.bfloat16, torch.float32]


def test_amp_fp16_runs_float16_with_a_grad_scaler_as_a_gpu_without_bfloat16_does() -> None:
    original, reference = workload(), workload()
    block = original.model[0]
    weights = block.linear.weight.detach().clone()
    with applied(original, ("amp-fp16",), CPU) as (variant, how):
        assert how == "autocast float16 with a GradScaler"
        assert variant.train_step is not None
        (scaler,) = grad_scalers(variant.train_step)
        variant.run_train_step(variant.build_optimizer(), variant.host_batch(4))
        assert scaler.get_scale() == 65536.0  # the loss was scaled, and its gradients were finite
    assert block.dtypes == [torch.float16]
    # The step taken is the float32 step's to float16's precision: the gradients were unscaled.
    step(reference, reference.host_batch(4))
    moved, wanted = block.linear.weight - weights, reference.model[0].linear.weight - weights
    assert wanted.abs().max() > 0
    torch.testing.assert_close(moved, wanted, rtol=0.02, atol=2e-4)
    with applied(original, ("amp-bf16",), CPU) as (variant, how):
        assert how == "autocast bfloat16" and not grad_scalers(variant.train_step)


def test_accumulation_steps_once_with_the_mean_gradient() -> None:
    # k micro-batches of the same samples accumulate to the gradient of one batch of them.
    original, reference = workload(), workload()
    batch = original.host_batch(6)
    with applied(original, ("accumulation",), CPU, accumulation_steps=3) as (variant, how):
        assert how == "3 accumulation steps per optimizer step"
        optimizer = variant.build_optimizer()
        variant.run_train_step(optimizer, batch)
    reference.run_train_step(reference.build_optimizer(), copy.deepcopy(batch))
    for got, want in zip(original.model.parameters(), reference.model.parameters(), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)


def test_cudnn_benchmark_is_put_back() -> None:
    before = torch.backends.cudnn.benchmark
    with applied(workload(), ("cudnn-benchmark-on",), CPU) as (_, how):
        assert torch.backends.cudnn.benchmark is True and how == "cudnn.benchmark=True"
    assert torch.backends.cudnn.benchmark == before


EXPANDABLE_ROW = """
import sys
import torch
from torch import nn
import batchfit
from batchfit.runtime.devices.allocator_settings import expandable_segments
from batchfit.runtime.steps.techniques import applied
if sys.argv[1] == "old":  # a torch before 2.9 keeps no account of its allocator's settings
    del torch._C._accelerator_getAllocatorSettings
model = nn.Linear(4, 2)
workload = batchfit.Workload(model, torch.optim.SGD(model.parameters(), lr=0.1),
                             make_batch=lambda n: (torch.randn(n, 4), torch.randint(0, 2, (n,))),
                             loss_fn=nn.functional.cross_entropy)
seen = [expandable_segments()]
try:
    with applied(workload, ("expandable-segments",), torch.device("cpu")) as (_, how):
        seen += [expandable_segments(), how]
        raise KeyboardInterrupt
except KeyboardInterrupt:
    pass
seen.append(expandable_segments())
print(seen)
"""


@pytest.mark.parametrize("torch_account", ["own", "old"])
def test_expandable_segments_are_set_for_the_row_and_put_back_after_an_interrupt(torch_account: str) -> None:
    # The allocator's setting is the process's: a fresh interpreter for it. On the CPU build the
    # setting is taken and reported as on CUDA; what it changes there is tests/test_gpu.py's.
    env = {key: value for key, value in os.environ.items() if "ALLOC_CONF" not in key}
    done = subprocess.run(
        [sys.executable, "-c", EXPANDABLE_ROW, torch_account], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[False, True, 'expandable_segments:True', False]"

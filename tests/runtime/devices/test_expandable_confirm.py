"""How long a caching device confirms its answer: 10 steps with CUDA's default allocator, 40 with
expandable segments, whose mapped pages settle over more steps (the replay of the H200's recorded
requests: bench/expandable_agreement.py); a confirming trial still stops where the state recurs."""

from __future__ import annotations

import os
import subprocess
import sys

import torch
from torch import nn

from batchfit import BatchSizes, Workload
from batchfit.runtime.devices.caching_device import CONFIRM_STEPS, EXPANDABLE_CONFIRM_STEPS, CachingCpuDevice
from batchfit.search.find_batch_size import find_on
from batchfit.where import ResolvedDevice


def test_the_stand_in_confirms_as_long_as_its_allocator_needs() -> None:
    assert (CONFIRM_STEPS, EXPANDABLE_CONFIRM_STEPS) == (10, 40)
    assert CachingCpuDevice(2**30).confirm_steps == 10
    assert CachingCpuDevice(2**30, expandable_segments=True).confirm_steps == 40


def test_cuda_confirms_as_long_as_the_allocator_s_settings_need() -> None:
    # Read at each search, as the setting stands then: from PYTORCH_CUDA_ALLOC_CONF, and as set at
    # run time (compare turns it on for a row and off after).
    code = (
        "from batchfit.runtime.devices.allocator_settings import set_allocator_settings\n"
        "from batchfit.runtime.devices.cuda import CudaDevice\n"
        "device = CudaDevice(0)\n"
        "before = device.confirm_steps\n"
        "set_allocator_settings('expandable_segments:False')\n"
        "print(before, device.confirm_steps)\n"
    )
    env = {key: value for key, value in os.environ.items() if "ALLOC_CONF" not in key}
    env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["40", "10"]


def test_on_the_expandable_stand_in_the_answer_is_confirmed_until_its_state_recurs() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))

    def make_batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(n)
        return torch.randn(n, 64, generator=generator), torch.randint(0, 10, (n,), generator=generator)

    workload = Workload(
        model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        make_batch=make_batch,
        loss_fn=nn.functional.cross_entropy,
        name="expandable-confirm-mlp",
    )
    target = ResolvedDevice(CachingCpuDevice(12 * 2**20, expandable_segments=True), 1.0)
    result = find_on(target, workload, "train", BatchSizes(max_batch_size=4096))
    assert result.confirm_steps == 40
    answer = result.answer
    assert answer.fits and answer.steady_from is not None and answer.steps < 40, answer

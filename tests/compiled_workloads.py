"""The model of runtime/test_compiled.py, its child process and test_gpu.py: blocks of pointwise ops,
where Inductor's fused kernels keep far less for backward than eager's intermediates."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch
from torch import nn

CHILD = Path(__file__).parent / "runtime" / "steps" / "compiled_child.py"


class PointwiseBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(512, 512)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.linear(x)
        return x + torch.sigmoid(h) * torch.tanh(h) * nn.functional.gelu(h) + h.exp().clamp(max=3)


def pointwise_model(blocks: int = 4) -> nn.Module:
    return nn.Sequential(*[PointwiseBlock() for _ in range(blocks)], nn.Linear(512, 10))


def make_batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(n, 512), torch.randint(0, 10, (n,))


def compiled_truth(sizes: list[int], static_blocks: int | None = None) -> dict[int, int]:
    """Each size's peak over 2 SGD steps of the compiled model, from the allocator's own running
    total, read in a fresh process (tests/runtime/steps/compiled_child.py says why)."""
    static = [] if static_blocks is None else ["--static", str(static_blocks)]
    command = [sys.executable, str(CHILD), *static, *map(str, sizes)]
    child = subprocess.run(command, capture_output=True, text=True, timeout=600, check=True)
    reading = json.loads(child.stdout.strip().splitlines()[-1])
    assert abs(reading["leftover"]) < 2**16, reading  # the steps freed what they allocated, in the session
    return {int(size): peak for size, peak in reading["peaks"].items()}

"""The model of runtime/test_compiled.py, its child process and test_gpu.py: blocks of pointwise ops,
where Inductor's fused kernels keep far less for backward than eager's intermediates."""

from __future__ import annotations

import torch
from torch import nn


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

"""CUDA's fused attention on fake tensors: inside the CPU-alone trace, ``scaled_dot_product_attention``
allocates what the kernel CUDA picks allocates (its output and a logsumexp kept for backward), not
the CPU's math path's L x L weights, softmax and dropout mask per head."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

aten = torch.ops.aten
#: Half types: CUDA's flash kernel takes them (on sm80 and later); float32 goes to memory-efficient.
HALF = (torch.float16, torch.bfloat16)


def cuda_kernel(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: Any, enable_gqa: bool
) -> str:
    """The fused kernel CUDA's dispatcher picks on sm80 and later ("flash", "efficient"), or "" where
    neither takes the call (the math path runs, as on the CPU): flash for half types without a mask,
    head dims to 256 and a multiple of 8; memory-efficient for float32 and half types with a mask."""
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4 or query.dtype != key.dtype != value.dtype:
        return ""
    if enable_gqa and query.size(1) != key.size(1):
        return ""  # grouped heads: flash takes them, memory-efficient does not; left unmodelled
    head_dim = query.size(-1)
    if query.dtype in HALF and attn_mask is None and head_dim <= 256 and head_dim % 8 == 0:
        return "flash"
    if query.dtype in (torch.float32, *HALF) and head_dim % 4 == 0 and value.size(-1) % 4 == 0:
        return "efficient"
    return ""


def fused_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor | None:
    """``scaled_dot_product_attention`` by CUDA's fused kernel's own aten op, whose meta kernel
    allocates what CUDA's does (its autograd node, what its backward does); None where no fused
    kernel takes the call. A boolean mask becomes a float bias, as CUDA's dispatcher converts it, its
    last dim padded to a multiple of 16 as the memory-efficient kernel needs."""
    kernel = cuda_kernel(query, key, value, attn_mask, enable_gqa)
    if kernel == "flash":
        flash: torch.Tensor = aten._scaled_dot_product_flash_attention(
            query, key, value, dropout_p, is_causal, scale=scale
        )[0]
        return flash
    if kernel != "efficient":
        return None
    bias = attn_mask
    if bias is not None:
        if bias.dtype == torch.bool:
            bias = torch.zeros(bias.shape, dtype=query.dtype).masked_fill(bias.logical_not(), float("-inf"))
        length = bias.size(-1)
        if length % 16:
            bias = F.pad(bias, (0, 16 - length % 16))[..., :length]
        shape = (query.size(0), query.size(1), query.size(2), key.size(2))
        bias = bias.expand(shape)
    grad = query.requires_grad or key.requires_grad or value.requires_grad
    efficient: torch.Tensor = aten._scaled_dot_product_efficient_attention(
        query, key, value, bias, grad, dropout_p, is_causal, scale=scale
    )[0]
    return efficient


class CudaAttention(TorchFunctionMode):
    """Inside it, ``scaled_dot_product_attention`` runs as ``fused_attention`` where a fused kernel
    takes the call, and counts the calls each way (``fused``, ``unfused``). A call made inside another
    torch function (``nn.MultiheadAttention``'s, inside ``multi_head_attention_forward``) is not
    seen: a mode is off inside its own handler, and runs as the CPU runs it."""

    def __init__(self) -> None:
        super().__init__()
        self.fused = self.unfused = 0

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            fused = fused_attention(*args, **kwargs)
            self.fused, self.unfused = self.fused + (fused is not None), self.unfused + (fused is None)
            if fused is not None:
                return fused
        return func(*args, **kwargs)

    def all_fused(self, module: torch.nn.Module) -> bool:
        """Whether the trace ran every attention call of ``module`` it saw as a fused kernel, and saw
        them all (none inside ``nn.MultiheadAttention``)."""
        hidden = any(isinstance(each, torch.nn.MultiheadAttention) for each in module.modules())
        return self.fused > 0 and self.unfused == 0 and not hidden


@contextmanager
def cuda_attention(mode: CudaAttention, module: torch.nn.Module) -> Iterator[CudaAttention]:
    """A block whose attention allocates as CUDA's fused kernels do (``mode``), and whose Hugging
    Face masking reads position ids as one sequence per row (``_unpacked``); none where ``module``
    holds an ``nn.MultiheadAttention``."""
    if any(isinstance(each, torch.nn.MultiheadAttention) for each in module.modules()):
        yield mode  # a mode turns off its fast paths (has_torch_function), and cannot see its calls
        return
    with mode, _unpacked():
        yield mode


@contextmanager
def _unpacked() -> Iterator[None]:
    """Transformers looks for several sequences packed in a row in the position ids it makes; it
    cannot read a fake tensor's values, so it takes them as packed and builds an explicit
    (batch, 1, L, L) mask, where CUDA's run, reading ``arange`` positions, builds none and passes
    ``is_causal``. Here the check answers "not packed", as it does on the model's own positions."""
    masking: Any = sys.modules.get("transformers.masking_utils")
    found = getattr(masking, "find_packed_sequence_indices", None)
    if found is None:
        yield
        return
    masking.find_packed_sequence_indices = lambda position_ids: None
    try:
        yield
    finally:
        masking.find_packed_sequence_indices = found

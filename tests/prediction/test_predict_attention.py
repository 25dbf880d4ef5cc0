"""Attention in the CPU-alone trace allocates as CUDA's fused kernel does (its output and logsumexp
kept for backward, not the math path's L x L weights), and GPT-2 small's trace stays near the
H200's recorded peaks."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

import batchfit
from batchfit.prediction.cpu_alone import ATTENTION_PART
from batchfit.runtime.steps.attention import CudaAttention, cuda_attention, cuda_kernel
from batchfit.runtime.workloads.examples import build_example

BATCH, HEADS, LENGTH, HEAD_DIM = 2, 4, 100, 16


def _attention(fused: bool) -> torch.Tensor:
    """A causal attention with dropout over a packed q, k, v projection, on fake tensors."""
    with FakeTensorMode(allow_non_fake_inputs=True):
        projection = torch.nn.Linear(HEADS * HEAD_DIM, 3 * HEADS * HEAD_DIM)
        packed = projection(torch.randn(BATCH, LENGTH, HEADS * HEAD_DIM))
        q, k, v = (t.view(BATCH, LENGTH, HEADS, HEAD_DIM).transpose(1, 2) for t in packed.chunk(3, -1))
        attention = CudaAttention()
        if not fused:
            return F.scaled_dot_product_attention(q, k, v, dropout_p=0.1, is_causal=True)
        with cuda_attention(attention, projection):
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=0.1, is_causal=True)
        assert (attention.fused, attention.unfused) == (1, 0)
        out.sum().backward(retain_graph=True)  # the kernel's backward runs on fakes too
        assert projection.weight.grad is not None
        return out


def test_the_trace_allocates_the_efficient_kernels_shapes() -> None:
    out = _attention(fused=True)
    node = out.grad_fn
    assert type(node).__name__ == "ScaledDotProductEfficientAttentionBackward0"
    assert out.untyped_storage().nbytes() == BATCH * LENGTH * HEADS * HEAD_DIM * 4
    logsumexp = node._saved_log_sumexp  # type: ignore[union-attr]
    assert tuple(logsumexp.shape) == (BATCH, HEADS, math.ceil(LENGTH / 32) * 32)  # padded, as CUDA's
    assert logsumexp.dtype == torch.float32


def test_the_kernel_cuda_picks() -> None:
    single = torch.empty(1, 2, 8, 64)
    half = single.half()
    assert cuda_kernel(single, single, single, None, False) == "efficient"
    assert cuda_kernel(half, half, half, None, False) == "flash"
    assert cuda_kernel(half, half, half, torch.ones(8, 8, dtype=torch.bool), False) == "efficient"
    assert cuda_kernel(single[0], single[0], single[0], None, False) == ""


def test_the_guessed_attention_share_widens_the_band_only_where_the_trace_did_not_fuse() -> None:
    # GPT-2 calls scaled_dot_product_attention, which the trace fuses: nothing guessed for it. The
    # built-in transformer's nn.MultiheadAttention is left unfused: its 10% share stays.
    pytest.importorskip("transformers")
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    import _workloads

    targets = batchfit.Targets(capacities="1GiB")
    gpt2 = _workloads.build("gpt2-tiny", torch.device("cpu"))
    fused = batchfit.predict(gpt2, targets, modes=("train",), device="cpu")
    assert fused.recorded_by == {"train": "trace"} and fused.unmodelled == ()
    assert any(part.startswith("attention as CUDA's fused kernel") for part in fused.modelled)
    unfused = batchfit.predict(build_example("transformer"), targets, modes=("train",), device="cpu")
    assert [(part.part, part.share) for part in unfused.unmodelled] == [(ATTENTION_PART, 0.10)]
    assert not any(part.startswith("attention as CUDA's fused kernel") for part in unfused.modelled)

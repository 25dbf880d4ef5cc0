"""The GPUs a prediction can name (``--gpu A100-40GB``): each card's memory as torch reports it,
what a CUDA context takes of it, and where each figure comes from.

A card's *total* is what ``torch.cuda.get_device_properties(...).total_memory`` reports (the total
in CUDA's out-of-memory message), less than the spec sheet's nominal size: the driver keeps some,
and ECC more. It varies a little with the driver, so each card carries the range seen. Its
*context* is the memory a process holds outside PyTorch's caching allocator (the CUDA context, the
kernels of cuBLAS and cuDNN it loads): it depends on the driver, the CUDA version and the libraries
loaded, so every context figure is an estimate with a range. Torch-free.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from batchfit.errors import ConfigurationError

GiB, MiB = 1 << 30, 1 << 20

#: The context when the card is not known (a capacity given in bytes): what the processes quoted
#: below held outside the allocator, on CUDA 12 with lazy loading: 0.49-0.77 GiB.
CONTEXT_BYTES = 768 * MiB
CONTEXT_LOW_BYTES, CONTEXT_HIGH_BYTES = 448 * MiB, 1024 * MiB
CONTEXT_SOURCE = (
    "estimate: the non-PyTorch memory of processes that ran out of memory (in use, less allocated "
    "and reserved-unallocated): H100 0.74-0.77 GiB (bench/data/h100-2026-11-25, torch 2.11), A100-40GB "
    "0.49 GiB (github.com/TianheWu/CoSeR/issues/10), L40 0.50 GiB (github.com/NVlabs/Eagle/issues/68), "
    "RTX 5090 0.58 GiB (github.com/Wan-Video/Wan2.1/issues/465); older CUDA without lazy loading "
    "takes more"
)

#: cuBLAS's workspace, which PyTorch takes from the caching allocator at the first matrix product
#: and keeps: ``:4096:8`` (32 MiB) on Hopper and later, ``:4096:2:16:8`` (8 MiB + 128 KiB) before
#: (``CUBLAS_WORKSPACE_CONFIG``'s defaults in ``aten/src/ATen/cuda/CublasHandlePool.cpp``).
CUBLAS_WORKSPACE_BYTES = {"hopper": 32 * MiB, "older": 8 * MiB + 128 * 1024}
#: How many such workspaces a training process holds: PyTorch keeps one per (handle, stream), a
#: handle per thread, and autograd runs CUDA's backward on a thread of its own; cuBLASLt keeps its
#: own besides. Eval is taken to hold as many, which errs towards the smaller batch (the evidence:
#: docs/predict.md, "The model and the replay against CUDA's allocator").
CUBLAS_WORKSPACES = 2


def cublas_workspaces(hopper: bool) -> tuple[int, ...]:
    """The workspaces CUDA keeps beside a step's own requests, on Hopper and later or before."""
    return (CUBLAS_WORKSPACE_BYTES["hopper" if hopper else "older"],) * CUBLAS_WORKSPACES


@dataclass(frozen=True)
class Card:
    """A GPU by name: its total memory as torch reports it (the lowest seen, and the highest), the
    context estimate, its architecture (which sizes cuBLAS's workspace) and the sources."""

    name: str
    nominal: str  # the spec sheet's memory
    total_bytes: int
    total_high_bytes: int
    hopper: bool
    source: str  # of the total
    context_bytes: int = CONTEXT_BYTES
    context_low_bytes: int = CONTEXT_LOW_BYTES
    context_high_bytes: int = CONTEXT_HIGH_BYTES
    context_source: str = CONTEXT_SOURCE

    @property
    def usable_bytes(self) -> int:
        """What the caching allocator may reserve: the total less the context."""
        return self.total_bytes - self.context_bytes


def _gib(value: float) -> int:
    return int(value * GiB)


_REPORTED = "the total capacity in CUDA out-of-memory messages quoted in"
#: The cards, by the name ``--gpu`` takes. Nominal sizes are NVIDIA's spec sheets; totals are what
#: torch reported on them, with the message's source; ``estimate`` where none was found. A card
#: measured once, inside the range estimated for it, keeps that range around its measurement.
CARDS: dict[str, Card] = {
    card.name: card
    for card in (
        Card("T4", "16 GB GDDR6", _gib(14.56), _gib(14.76), False,
             f"{_REPORTED} github.com/Zheng-Chong/CatVTON/issues/133 (14.56 GiB), "
             "github.com/xinge008/Cylinder3D/issues/109 (14.76 GiB)"),
        Card("L4", "24 GB GDDR6", _gib(21.9), _gib(22.2), False,
             "estimate: 24 GB less what the driver keeps on GDDR6 cards with ECC (as the T4 and A10); "
             "no message found"),
        Card("A10", "24 GB GDDR6", _gib(21.9), _gib(23.7), False,
             f"{_REPORTED} github.com/tatsu-lab/stanford_alpaca/issues/76 (23.70 GiB); with ECC on "
             "less (an estimate)"),
        Card("RTX-4090", "24 GB GDDR6X", _gib(23.61), _gib(23.68), False,
             f"{_REPORTED} github.com/pinokiofactory/flux-webui/issues/11 (23.61 GiB), "
             "github.com/zai-org/CogVideo/issues/36 (23.68 GiB)"),
        Card("RTX-5090", "32 GB GDDR7", _gib(31.37), _gib(31.51), False,
             f"{_REPORTED} github.com/Wan-Video/Wan2.1/issues/465 (31.37 GiB), "
             "github.com/siliconflow/onediff/pull/1041 (31.51 GiB)"),
        Card("A100-40GB", "40 GB HBM2", _gib(39.50), _gib(39.59), False,
             f"{_REPORTED} github.com/TianheWu/CoSeR/issues/10 (39.50 GiB), "
             "github.com/raoyongming/DenseCLIP/issues/52 (39.59 GiB)"),
        Card("L40S", "48 GB GDDR6", _gib(44.40), _gib(44.53), False,
             f"{_REPORTED} github.com/Wan-Video/Wan2.1/issues/205 (L40S, 44.53 GiB), "
             "github.com/NVlabs/Eagle/issues/68 (L40, 44.40 GiB)"),
        Card("A100-80GB", "80 GB HBM2e", _gib(79.25), _gib(79.33), False,
             f"{_REPORTED} github.com/levihsu/OOTDiffusion/issues/235 (79.25 GiB), "
             "github.com/hahnyuan/PB-LLM/issues/3 (A800, 79.33 GiB)"),
        Card("H100-80GB", "80 GB HBM3", _gib(79.18), _gib(79.18), True,
             "measured: the out-of-memory messages of bench/data/h100-2026-11-25 (79.18 GiB)",
             context_bytes=760 * MiB, context_low_bytes=740 * MiB, context_high_bytes=790 * MiB,
             context_source="measured: bench/data/h100-2026-11-25's out-of-memory messages, torch 2.11"),
        Card("H200", "141 GB HBM3e", _gib(139.0), _gib(140.0), True,
             "measured: the out-of-memory messages of bench/data/h200-2026-11-26-2/"
             "gpu-tests-first-failure.log (139.80 GiB); the range around it is an estimate, 141 GB "
             "scaled as the H100's 80 GB report 79.18 GiB"),
    )
}  # fmt: skip


def card_named(name: str) -> Card:
    """The card ``name`` names (case and ``-``/``_``/space alike); an error listing the names."""
    wanted = re.sub(r"[\s_]", "-", name.strip()).upper()
    for card in CARDS.values():
        if card.name.upper() == wanted:
            return card
    raise ConfigurationError(
        f"gpu={name!r} is not a card batchfit knows: use one of {', '.join(CARDS)}, "
        f"or give its memory with capacities=['24GiB'] (--capacities 24GiB)."
    )


_MESSAGE = re.compile(
    r"this process has ([0-9.]+) (GiB|MiB) memory in use.*?"
    r"([0-9.]+) (GiB|MiB) is allocated by PyTorch, and ([0-9.]+) (GiB|MiB) is reserved",
    re.DOTALL,
)


def context_in_message(message: str) -> int | None:
    """The memory the process held outside the caching allocator, read from CUDA's out-of-memory
    message (in use, less allocated and reserved-unallocated); None where the message lacks them.
    Each figure is rounded to 0.01 of its unit, so this is within about 15 MiB."""
    found = _MESSAGE.search(message)
    if found is None:
        return None
    scale = {"GiB": GiB, "MiB": MiB}
    in_use, allocated, unallocated = (
        float(found.group(index)) * scale[found.group(index + 1)] for index in (1, 3, 5)
    )
    return int(in_use - allocated - unallocated)

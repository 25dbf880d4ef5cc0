"""Workloads the benchmarks run: batchfit's built-in examples, and on a GPU real models built from
their packages' code (no download): torchvision's ResNet-50 in fp32 and with AMP and its ViT-B/16
with AdamW, and a GPT-2 small from its Hugging Face config (and a tiny one, for the CPU with CUDA's
allocator modelled). A model whose package is missing is skipped, with the reason; the fp32 ResNet-50
without torchvision is ``_resnet.py``'s copy of its architecture.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import _resnet
import torch
from torch import nn

import batchfit
from batchfit.runtime.workloads.examples import EXAMPLES, build_example

IMAGE_SIZE = 224
GPT2_TOKENS = 1024
GPT2_TINY_TOKENS = 128


def _images(classes: int) -> Callable[[int], tuple[torch.Tensor, torch.Tensor]]:
    def make_batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(n)
        images = torch.randn(n, 3, IMAGE_SIZE, IMAGE_SIZE, generator=generator)
        return images, torch.randint(0, classes, (n,), generator=generator)

    return make_batch


def resnet50(device: torch.device, amp: bool = False) -> batchfit.Workload:
    """torchvision's ResNet-50 (1000 classes) on 224x224 images, SGD with momentum; with ``amp``,
    autocast to fp16 and a GradScaler, as mixed-precision training runs it. Without torchvision (fp32
    only), ``_resnet.ResNet50``: the same modules, parameters, buffers and forward, not its code."""
    torch.manual_seed(0)
    model = _resnet50().to(device)
    workload = batchfit.Workload(
        model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        make_batch=_images(1000),
        loss_fn=nn.functional.cross_entropy,
        name="resnet50-amp" if amp else "resnet50",
    )
    if amp:
        scaler = torch.amp.GradScaler(device.type)

        def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, batch: Any) -> None:
            images, labels = batch
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast(device.type, dtype=torch.float16):
                loss = nn.functional.cross_entropy(model(images), labels)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()

        def eval_step(model: nn.Module, batch: Any) -> None:
            with torch.autocast(device.type, dtype=torch.float16):
                model(batch[0])

        workload.train_step, workload.eval_step = train_step, eval_step
    return workload


def _resnet50() -> nn.Module:
    """torchvision's ResNet-50 where torchvision is installed, else its copy in ``_resnet.py``."""
    try:
        import torchvision  # type: ignore[import-not-found,import-untyped,unused-ignore]
    except ImportError:
        return _resnet.ResNet50(num_classes=1000)
    model: nn.Module = torchvision.models.resnet50(weights=None)
    return model


def vit(device: torch.device) -> batchfit.Workload:
    """torchvision's ViT-B/16 on 224x224 images with AdamW, as its recipe trains it (fp32 here)."""
    import torchvision  # type: ignore[import-not-found,import-untyped,unused-ignore]

    torch.manual_seed(0)
    model = torchvision.models.vit_b_16(weights=None).to(device)
    return batchfit.Workload(
        model=model,
        optimizer=torch.optim.AdamW(model.parameters(), lr=3e-4),
        make_batch=_images(1000),
        loss_fn=nn.functional.cross_entropy,
        name="vit-b16",
    )


def gpt2(device: torch.device, tiny: bool = False) -> batchfit.Workload:
    """A GPT-2 small (124M parameters) built from its Hugging Face config, on 1024-token sequences
    with AdamW and no key-value cache, as training runs it; the model computes its own loss from
    ``labels``. ``tiny``: the same code at a size the CPU trains in seconds (2 layers of 128, a
    vocabulary of 1000, 128-token sequences), for a real model's requests on the modelled allocator."""
    import transformers  # type: ignore[import-not-found,import-untyped,unused-ignore]

    torch.manual_seed(0)
    tokens_per_sample = GPT2_TINY_TOKENS if tiny else GPT2_TOKENS
    # Training keeps no key-value cache (the default keeps one, which activation checkpointing
    # would hold twice over during recomputation).
    size: dict[str, Any] = {
        "n_layer": 2,
        "n_embd": 128,
        "n_head": 4,
        "vocab_size": 1000,
        "bos_token_id": 0,
        "eos_token_id": 0,
    }
    config = transformers.GPT2Config(n_positions=tokens_per_sample, use_cache=False, **(size if tiny else {}))
    model: nn.Module = transformers.GPT2LMHeadModel(config)  # typed as a module: its own .to is wrapped
    model = model.to(device)

    def make_batch(n: int) -> dict[str, torch.Tensor]:
        shape = (n, tokens_per_sample)
        tokens = torch.randint(0, config.vocab_size, shape, generator=torch.Generator().manual_seed(n))
        return {"input_ids": tokens, "labels": tokens}

    return batchfit.Workload(
        model=model,
        optimizer=torch.optim.AdamW(model.parameters(), lr=3e-4),
        make_batch=make_batch,
        tokens_per_sample=tokens_per_sample,
        name="gpt2-tiny" if tiny else "gpt2",
    )


REAL: dict[str, Callable[[torch.device], batchfit.Workload]] = {
    "resnet50": resnet50,
    "resnet50-amp": lambda device: resnet50(device, amp=True),
    "vit-b16": vit,
    "gpt2": gpt2,
    "gpt2-tiny": lambda device: gpt2(device, tiny=True),
}
#: The package each real model needs (the fp32 ResNet-50 none: ``_resnet.py`` stands in for it).
PACKAGES = {
    "resnet50": "torch",
    "resnet50-amp": "torchvision",
    "vit-b16": "torchvision",
    "gpt2": "transformers",
    "gpt2-tiny": "transformers",
}


def build(name: str, device: torch.device) -> batchfit.Workload:
    """A fresh workload: a built-in example or a real model (ImportError if its package is missing)."""
    if name in EXAMPLES:
        return build_example(name, device)
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        return REAL[name](device)


def missing(name: str) -> str | None:
    """Why ``name`` cannot be built here (its package is not installed), or None."""
    if name in EXAMPLES:
        return None
    try:
        __import__(PACKAGES[name])
    except ImportError as error:
        return f"{PACKAGES[name]} is not installed ({error})"
    return None


def loss_of(workload: batchfit.Workload, batch: Any) -> torch.Tensor:
    """The workload's loss on a batch already on its device (for a framework's own step)."""
    return workload._loss(batch)

"""Workloads the benchmarks run: batchfit's built-in examples, and on a GPU real models built from
their packages' code (no download): torchvision's ResNet-50 in fp32 and with AMP, and a GPT-2
small from its Hugging Face config. A model whose package is missing is skipped, with the reason.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

import batchfit
from batchfit.runtime.examples import EXAMPLES, build_example

IMAGE_SIZE = 224
GPT2_TOKENS = 1024


def _images(classes: int) -> Callable[[int], tuple[torch.Tensor, torch.Tensor]]:
    def make_batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(n)
        images = torch.randn(n, 3, IMAGE_SIZE, IMAGE_SIZE, generator=generator)
        return images, torch.randint(0, classes, (n,), generator=generator)

    return make_batch


def resnet50(device: torch.device, amp: bool = False) -> batchfit.Workload:
    """torchvision's ResNet-50 on 224x224 images, SGD with momentum; with ``amp``, autocast to fp16
    and a GradScaler, as mixed-precision training runs it."""
    import torchvision  # type: ignore[import-not-found,import-untyped,unused-ignore]

    torch.manual_seed(0)
    model = torchvision.models.resnet50(weights=None).to(device)
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


def gpt2(device: torch.device) -> batchfit.Workload:
    """A GPT-2 small (124M parameters) built from its Hugging Face config, on 1024-token sequences
    with AdamW and no key-value cache, as training runs it; the model computes its own loss from
    ``labels``."""
    import transformers  # type: ignore[import-not-found,import-untyped,unused-ignore]

    torch.manual_seed(0)
    # Training keeps no key-value cache (the default keeps one, which activation checkpointing
    # would hold twice over during recomputation).
    config = transformers.GPT2Config(n_positions=GPT2_TOKENS, use_cache=False)
    model = transformers.GPT2LMHeadModel(config).to(device)

    def make_batch(n: int) -> dict[str, torch.Tensor]:
        tokens = torch.randint(
            0, config.vocab_size, (n, GPT2_TOKENS), generator=torch.Generator().manual_seed(n)
        )
        return {"input_ids": tokens, "labels": tokens}

    return batchfit.Workload(
        model=model,
        optimizer=torch.optim.AdamW(model.parameters(), lr=3e-4),
        make_batch=make_batch,
        tokens_per_sample=GPT2_TOKENS,
        name="gpt2",
    )


REAL: dict[str, Callable[[torch.device], batchfit.Workload]] = {
    "resnet50": resnet50,
    "resnet50-amp": lambda device: resnet50(device, amp=True),
    "gpt2": gpt2,
}
#: The package each real model needs.
PACKAGES = {"resnet50": "torchvision", "resnet50-amp": "torchvision", "gpt2": "transformers"}


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

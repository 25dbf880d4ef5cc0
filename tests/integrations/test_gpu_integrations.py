"""Both adapters on a GPU, on one real model each (marked ``gpu``: skipped without CUDA): Lightning
on torchvision's ResNet-50 under bf16-mixed, the Hugging Face Trainer on GPT-2 small from its
config; each found size then trains 20 steps under the same cap. ``adapters_check.py`` holds the
runs, which the CPU can exercise on tiny models."""

from __future__ import annotations

import pytest
import torch
from adapters_check import hf_trains_at_its_plan, lightning_trains_at_its_plan

pytestmark = pytest.mark.gpu


def test_lightning_resnet50_trains_at_the_size_found() -> None:
    torchvision = pytest.importorskip("torchvision")
    pytest.importorskip("lightning")
    model = torchvision.models.resnet50(num_classes=100)
    found = lightning_trains_at_its_plan(model, (3, 224, 224), 100, "cuda", "10GiB", "bf16-mixed")
    print(f"lightning resnet50 bf16-mixed at 10GiB: {found}")
    assert found >= 8


def test_hf_trainer_gpt2_small_trains_at_the_size_found() -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_positions=1024, bos_token_id=0, eos_token_id=0)  # GPT-2 small
    model = transformers.GPT2LMHeadModel(config)
    assert torch.cuda.is_available()
    found = hf_trains_at_its_plan(model, config.vocab_size, 1024, "cuda", "16GiB")
    print(f"hf trainer gpt2 small bf16 at 16GiB: {found}")
    assert found >= 1

"""The adapters' GPU runs, written once for any device: search with the adapter under a cap,
then train 20 steps at what it found under the same cap (``batchfit.cap_memory``), on random
data. ``test_gpu_integrations.py`` runs them on real models on CUDA."""

from __future__ import annotations

import tempfile
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

import batchfit
from batchfit.units import parse_bytes

STEPS = 20


def lightning_trains_at_its_plan(
    model: torch.nn.Module, shape: tuple[int, ...], classes: int, device: str, limit: str, precision: str
) -> int:
    """The train batch ``BatchfitCallback`` finds for ``model`` on images of ``shape``, after a fit
    of ``STEPS`` steps at it under the cap ran without running out of memory."""
    import lightning.pytorch as pl

    from batchfit.integrations.lightning import BatchfitCallback

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model, self.batch_size = model, 1
            # On the host, made before the cap: a loader's data is not the device's memory.
            self.data = TensorDataset(torch.randn(1024, *shape), torch.randint(0, classes, (1024,)))

        def training_step(self, batch: Any, index: int) -> torch.Tensor:
            images, labels = batch
            return torch.nn.functional.cross_entropy(self.model(images), labels)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01, momentum=0.9)

        def train_dataloader(self) -> DataLoader[Any]:
            return DataLoader(self.data, batch_size=self.batch_size, shuffle=True)

    accelerator = "gpu" if device == "cuda" else "cpu"
    callback = BatchfitCallback(memory_limit=limit, keep_global_batch_size=False)  # the largest that fits
    module = Module()
    with tempfile.TemporaryDirectory() as folder:
        trainer = pl.Trainer(
            accelerator=accelerator,
            devices=1,
            precision=precision,
            max_steps=STEPS,
            callbacks=[callback],
            default_root_dir=folder,
            enable_progress_bar=False,
            enable_checkpointing=False,
            logger=False,
        )
        budget = int(0.8 * parse_bytes(limit))
        with batchfit.cap_memory(budget, resident=[module], device=device):
            trainer.fit(module)  # the search, then STEPS steps at its answer
    assert trainer.global_step == STEPS
    return int(module.batch_size)


def hf_trains_at_its_plan(model: torch.nn.Module, vocab: int, length: int, device: str, limit: str) -> int:
    """The micro-batch ``BatchfitTrainer`` fits for a causal LM on sequences of ``length``, after
    ``STEPS`` steps of training at it under the cap ran without running out of memory."""
    from transformers import TrainingArguments

    from batchfit.integrations.transformers import BatchfitTrainer

    tokens = torch.randint(0, vocab, (512, length), generator=torch.Generator().manual_seed(0))
    train = [{"input_ids": row.tolist(), "labels": row.tolist()} for row in tokens]
    with tempfile.TemporaryDirectory() as folder:
        args = TrainingArguments(
            output_dir=folder,
            use_cpu=device == "cpu",
            bf16=True,
            per_device_train_batch_size=64,
            max_steps=STEPS,
            save_strategy="no",
            report_to=[],
            disable_tqdm=True,
        )
        trainer = BatchfitTrainer(model=model, args=args, train_dataset=train, memory_limit=limit)
        plan = trainer.fit_batch_sizes()
        budget = int(0.8 * parse_bytes(limit))
        with batchfit.cap_memory(budget, resident=[model], device=device):
            trainer.train()
    assert trainer.state.global_step == STEPS
    return int(plan.micro_batch_size)

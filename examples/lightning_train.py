"""Train a small Lightning model at batch sizes that fit, found at the start of fit.

    python examples/lightning_train.py
    python examples/lightning_train.py --precision bf16-mixed --gradient-clip-val 1.0
    python examples/lightning_train.py --global-batch-size 2048
    python examples/lightning_train.py --no-keep-global-batch-size
    python examples/lightning_train.py --devices 2 --strategy ddp

``batchfit.integrations.lightning.BatchfitCallback`` searches the train batch (and the eval batch)
on the module's own training_step and validation_step, under the Trainer's precision, clipping,
optimizer and accumulation, here on a CPU standing in for a device of ``--memory-limit``. It sets
``batch_size`` and ``eval_batch_size`` (the module's hparams, which its loaders read) and the
accumulation that keeps the global batch: the module's 32 x 1 x devices, or ``--global-batch-size``;
``--no-keep-global-batch-size`` trains the largest batch that fits instead. The plan is written into
the checkpoint; ``--resume`` fits on from it without searching again. Under ``--strategy ddp``
every rank searches in lockstep and trains at the answer that fits the smallest device. A small
CNN on random images: no download, under a minute on a 2-core CPU.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from batchfit import BatchSizes
from batchfit.integrations.lightning import BatchfitCallback


class SmallCNN(pl.LightningModule):
    """A two-layer CNN on 3x32x32 images; its loaders read ``batch_size`` and ``eval_batch_size``."""

    def __init__(self, batch_size: int = 32, eval_batch_size: int = 32, learning_rate: float = 1e-3) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(32, 10),
        )
        generator = torch.Generator().manual_seed(0)  # 4096 random images, 10 classes
        self.images = TensorDataset(
            torch.randn(4096, 3, 32, 32, generator=generator),
            torch.randint(0, 10, (4096,), generator=generator),
        )

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        images, labels = batch
        loss = nn.functional.cross_entropy(self.net(images), labels)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        images, labels = batch
        self.log("val_loss", nn.functional.cross_entropy(self.net(images), labels), sync_dist=True)

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.AdamW(self.parameters(), lr=self.hparams.learning_rate)
        schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=100)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}

    def train_dataloader(self) -> DataLoader[Any]:
        return DataLoader(self.images, batch_size=self.hparams.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader[Any]:
        return DataLoader(self.images, batch_size=self.hparams.eval_batch_size)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--memory-limit", default="64MiB", help="the device's capacity (default: %(default)s)"
    )
    parser.add_argument("--memory-fraction", type=float, default=0.8, help="default: %(default)s")
    parser.add_argument("--global-batch-size", type=int, help="samples per optimizer step over all ranks")
    parser.add_argument(
        "--keep-global-batch-size",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="keep the global batch (default); --no-keep-global-batch-size: the largest batch that fits",
    )
    parser.add_argument("--precision", default="32-true", help="the Trainer's (default: %(default)s)")
    parser.add_argument("--gradient-clip-val", type=float, help="the Trainer's gradient clipping")
    parser.add_argument("--devices", type=int, default=1, help="CPU processes (default: %(default)s)")
    parser.add_argument("--strategy", default="auto", help="the Trainer's: auto, ddp (default: %(default)s)")
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps (default: %(default)s)")
    checkpoint = Path(tempfile.gettempdir()) / "batchfit_lightning_train.ckpt"
    parser.add_argument("--checkpoint", type=Path, default=checkpoint, help="default: %(default)s")
    parser.add_argument("--resume", action="store_true", help="fit on from --checkpoint")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s", stream=sys.stderr)
    torch.set_num_threads(1 if args.devices > 1 else torch.get_num_threads())  # a core per rank

    callback = BatchfitCallback(
        memory_limit=args.memory_limit,
        memory_fraction=args.memory_fraction,
        sizes=BatchSizes(global_batch_size=args.global_batch_size),
        eval_batch_arg_name="eval_batch_size",
        keep_global_batch_size=args.keep_global_batch_size,
    )
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=args.devices,
        strategy=args.strategy,
        precision=args.precision,
        gradient_clip_val=args.gradient_clip_val,
        max_steps=args.steps * (2 if args.resume else 1),
        limit_val_batches=2,
        val_check_interval=10,
        callbacks=[callback],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    model = SmallCNN()
    trainer.fit(model, ckpt_path=args.checkpoint if args.resume else None)
    trainer.save_checkpoint(args.checkpoint)
    if trainer.is_global_zero:
        plan = torch.load(args.checkpoint, weights_only=False)["batchfit"]
        print(f"trained {trainer.global_step} steps; the checkpoint's plan: {plan}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

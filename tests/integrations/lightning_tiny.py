"""A tiny real LightningModule for the Lightning adapter's tests (the DDP ranks import it too),
the Trainer they run it in, and the truth by force: whether real Lightning training steps at a
batch size run under a cap."""

from __future__ import annotations

import contextlib
from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import batchfit

#: Samples in the dataset: three of the largest batches a test trains, so that an accumulation of
#: three batches is of full ones.
SAMPLES = 4096


class Classifier(pl.LightningModule):
    """An MLP on random features; its loaders read ``batch_size`` and ``eval_batch_size`` (hparams)."""

    def __init__(self, batch_size: int = 4, eval_batch_size: int = 4, optimizers: str = "single") -> None:
        super().__init__()
        self.save_hyperparameters()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 10))
        generator = torch.Generator().manual_seed(0)
        features = torch.randn(SAMPLES, 32, generator=generator)
        self.data = TensorDataset(features, torch.randint(0, 10, (SAMPLES,), generator=generator))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        inputs, target = batch
        loss = nn.functional.cross_entropy(self.net(inputs), target)
        self.log("loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        inputs, target = batch
        self.log("val_loss", nn.functional.cross_entropy(self.net(inputs), target))

    def test_step(self, batch: Any, batch_idx: int) -> None:
        inputs, target = batch
        self.log("accuracy", (self.net(inputs).argmax(dim=1) == target).float().mean())

    def configure_optimizers(self) -> Any:
        """One AdamW, in each of the forms Lightning takes (``optimizers``)."""
        optimizer = torch.optim.AdamW(self.parameters(), lr=1e-3)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=5)
        if self.hparams.optimizers == "dict":
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
        if self.hparams.optimizers == "lists":
            return [optimizer], [scheduler]
        if self.hparams.optimizers == "tuple":
            return (optimizer,)
        return optimizer

    def train_dataloader(self) -> DataLoader[Any]:
        return DataLoader(self.data, batch_size=self.hparams.batch_size)

    def val_dataloader(self) -> DataLoader[Any]:
        return DataLoader(self.data, batch_size=self.hparams.eval_batch_size)

    def test_dataloader(self) -> DataLoader[Any]:
        return DataLoader(self.data, batch_size=self.hparams.eval_batch_size)


def trainer(callbacks: list[pl.Callback], **settings: Any) -> pl.Trainer:
    """A quiet CPU Trainer: no logger, checkpoints, progress bar or validation unless asked."""
    defaults: dict[str, Any] = {
        "accelerator": "cpu",
        "devices": 1,
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "num_sanity_val_steps": 0,
        "limit_val_batches": 0,
    }
    return pl.Trainer(callbacks=callbacks, **{**defaults, **settings})


class Capped(pl.Callback):
    """Runs each training, validation and test batch under ``batchfit.cap_memory(cap_bytes)`` as a
    device of that size holds it: the module, its gradients, the optimizers' state and the batch
    resident (a loader's batches, the next one prefetched among them, live on a GPU's host, so a
    batch counts from its transfer on), and counts the optimizer steps and the evaluation batches."""

    def __init__(self, cap_bytes: int) -> None:
        self.cap_bytes = cap_bytes
        self.steps = 0
        self.validated = 0
        self._cap = contextlib.ExitStack()

    def _enter(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any) -> None:
        resident = [pl_module, *trainer.optimizers, batch]
        self._cap.enter_context(batchfit.cap_memory(self.cap_bytes, resident=resident))

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, *_: Any
    ) -> None:
        self._enter(trainer, pl_module, batch)

    def on_train_batch_end(self, trainer: pl.Trainer, *_: Any) -> None:
        self._cap.close()
        self.steps = trainer.global_step

    def on_validation_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, *_: Any
    ) -> None:
        self._enter(trainer, pl_module, batch)

    def on_validation_batch_end(self, *_: Any) -> None:
        self._cap.close()
        self.validated += 1

    def on_test_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, *_: Any
    ) -> None:
        self._enter(trainer, pl_module, batch)

    def on_test_batch_end(self, *_: Any) -> None:
        self._cap.close()
        self.validated += 1

    def on_exception(self, *_: Any) -> None:
        self._cap.close()


def trains(
    batch_size: int, cap_bytes: int, optimizers: str = "single", steps: int = 3, **settings: Any
) -> bool:
    """Whether a fresh Classifier's first ``steps`` Lightning training steps at ``batch_size`` run
    under ``cap_bytes`` (its optimizer's state made inside the cap, as in any fit)."""
    model = Classifier(batch_size=batch_size, optimizers=optimizers)
    capped = Capped(cap_bytes)
    try:
        trainer([capped], max_steps=steps, **settings).fit(model)
    except torch.OutOfMemoryError:
        return False
    return capped.steps == steps


def evaluates(eval_batch_size: int, cap_bytes: int, stage: str, batches: int = 2) -> bool:
    """Whether a fresh Classifier's first ``batches`` batches of ``eval_batch_size`` run under
    ``cap_bytes`` in ``Trainer.validate`` or ``Trainer.test`` (``stage``)."""
    model = Classifier(eval_batch_size=eval_batch_size)
    capped = Capped(cap_bytes)
    run = trainer([capped], limit_val_batches=batches, limit_test_batches=batches)
    try:
        getattr(run, stage)(model, verbose=False)
    except torch.OutOfMemoryError:
        return False
    return capped.validated == batches


class Regressor(pl.LightningModule):
    """A tanh MLP (no BatchNorm unless ``batch_norm``) on ``samples`` random float64 samples, trained
    by SGD on the mean squared error; its loader reads ``hparams.batch_size``, or trains at
    ``fixed_batch_size`` whatever that says. The loss is logged as the epoch's mean."""

    def __init__(
        self,
        batch_size: int = 4,
        samples: int = 64,
        fixed_batch_size: int | None = None,
        batch_norm: bool = False,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        torch.manual_seed(0)
        norm: nn.Module = nn.BatchNorm1d(64) if batch_norm else nn.Identity()
        self.net = nn.Sequential(nn.Linear(16, 64), norm, nn.Tanh(), nn.Linear(64, 1))
        generator = torch.Generator().manual_seed(0)
        inputs = torch.randn(samples, 16, generator=generator, dtype=torch.float64)
        self.data = TensorDataset(inputs, torch.randn(samples, 1, generator=generator, dtype=torch.float64))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        inputs, target = batch
        loss = nn.functional.mse_loss(self.net(inputs), target)
        self.log("loss", loss, on_step=False, on_epoch=True)
        return loss

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self) -> DataLoader[Any]:
        return DataLoader(self.data, batch_size=self.hparams.fixed_batch_size or self.hparams.batch_size)


class FirstStep(pl.Callback):
    """The sizes of the micro-batches of the first optimizer step, and its gradients as the
    optimizer is about to take them (the search's trial steps, before training starts, aside)."""

    def __init__(self) -> None:
        self.gradients: list[torch.Tensor] = []
        self.micro_batches: list[int] = []
        self._training = False

    def on_train_start(self, *_: Any) -> None:
        self._training = True

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, *_: Any
    ) -> None:
        if self._training and not self.gradients:
            self.micro_batches.append(len(batch[0]))

    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *_: Any) -> None:
        if self._training and not self.gradients:
            self.gradients = [parameter.grad.clone() for parameter in pl_module.parameters()]


def one_step(
    model: Regressor, callbacks: list[pl.Callback], accumulation: int = 1
) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor, list[int]]:
    """One float64 optimizer step of ``model`` (its dataset one global batch: the epoch is that
    step): the gradients before it, the parameters after it, the logged loss, and the sizes of the
    micro-batches it accumulated."""
    step = FirstStep()
    run = trainer([*callbacks, step], max_steps=1, precision="64-true", accumulate_grad_batches=accumulation)
    run.fit(model)
    parameters = [parameter.detach().clone() for parameter in model.parameters()]
    return step.gradients, parameters, run.callback_metrics["loss"], step.micro_batches

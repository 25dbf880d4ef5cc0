"""What ``BatchfitCallback`` needs of the Trainer and the module before it searches, or an error
that says what to change: one loader per mode, a batch size attribute, a strategy it runs."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import GradientAccumulationScheduler
from lightning.pytorch.strategies import (
    DDPStrategy,
    DeepSpeedStrategy,
    ModelParallelStrategy,
    SingleDeviceStrategy,
)
from lightning.pytorch.strategies.single_xla import SingleDeviceXLAStrategy
from lightning.pytorch.strategies.xla import XLAStrategy
from lightning.pytorch.trainer.connectors.data_connector import _DataLoaderSource
from lightning.pytorch.utilities.parsing import lightning_hasattr
from torch.utils.data import DataLoader

from batchfit.errors import ConfigurationError
from batchfit.integrations.lightning_steps import loaders_of
from batchfit.options import BatchSizes
from batchfit.policy.micro_batch import check_divisible


def one_loader(source: _DataLoaderSource) -> DataLoader[Any]:
    """The DataLoader the module's (or datamodule's) data hook returns: exactly one."""
    found = loaders_of(source.dataloader())
    if len(found) != 1:
        raise ConfigurationError(
            f"{source.name}() returned {len(found)} DataLoaders; batchfit sizes one loader per mode, "
            f"read from one batch size attribute. Return one DataLoader, or search the others with "
            f"batchfit.find_batch_size."
        )
    return found[0]


def check_fit(trainer: pl.Trainer, pl_module: pl.LightningModule, name: str, sizes: BatchSizes) -> None:
    """What the callback needs of ``fit``, or an error that says what to change."""
    check_strategy(trainer)
    if not pl_module.automatic_optimization:
        raise ConfigurationError(
            f"{type(pl_module).__name__} sets automatic_optimization=False: its training_step runs "
            f"its own backward and optimizer step, through the strategy's collectives. The callback "
            f"measures automatic optimization; search a step of your own with batchfit.find_batch_size."
        )
    if not trainer.fit_loop._data_source.is_module():
        raise ConfigurationError(
            "trainer.fit(train_dataloaders=...) hands the Trainer DataLoaders built at their batch "
            "size already, which a size found cannot change. Build them in the LightningModule's "
            "(or LightningDataModule's) train_dataloader() from its batch_size attribute."
        )
    check_attribute(pl_module, name, "batch_arg_name")
    target = sizes.global_batch_size
    if sizes.world_size is not None and sizes.world_size != trainer.world_size:
        raise ConfigurationError(
            f"sizes.world_size={sizes.world_size}, but the Trainer runs {trainer.world_size} "
            f"ranks (num_nodes x devices); leave world_size out, and the Trainer's is used."
        )
    if target is not None:
        check_divisible(target, trainer.world_size)
        callbacks = getattr(trainer, "callbacks", ())
        if any(isinstance(callback, GradientAccumulationScheduler) for callback in callbacks):
            raise ConfigurationError(
                f"sizes.global_batch_size={target} sets accumulate_grad_batches, which a "
                f"GradientAccumulationScheduler changes every epoch: remove one of the two."
            )


def check_strategy(trainer: pl.Trainer) -> None:
    """A strategy whose steps batchfit runs as they train: one device, DDP, or FSDP2
    (``ModelParallelStrategy`` with ``fully_shard``)."""
    strategy = trainer.strategy
    known = (SingleDeviceStrategy, DDPStrategy, ModelParallelStrategy)
    other = (DeepSpeedStrategy, XLAStrategy, SingleDeviceXLAStrategy)
    if not isinstance(strategy, known) or isinstance(strategy, other):
        raise ConfigurationError(
            f"the Trainer's strategy is {type(strategy).__name__}; batchfit runs the steps of "
            f"SingleDeviceStrategy, DDPStrategy and ModelParallelStrategy (FSDP2's "
            f"fully_shard in configure_model). For FSDPStrategy (FSDP1), shard with fully_shard "
            f"under ModelParallelStrategy instead."
        )


def check_attribute(pl_module: pl.LightningModule, name: str, parameter: str) -> None:
    if not lightning_hasattr(pl_module, name):
        raise ConfigurationError(
            f"{type(pl_module).__name__} exposes no {name!r}: neither the module, its hparams nor "
            f"its datamodule has it, so a batch size found could not reach its DataLoader. Give the "
            f"module (or its LightningDataModule) a {name} attribute that its dataloader hooks read "
            f"(self.{name} = 32, or an __init__ argument kept by save_hyperparameters()), or pass "
            f"{parameter}= the one they read."
        )

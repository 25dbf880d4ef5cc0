"""What ``BatchfitCallback`` needs of its arguments, the Trainer and the module before it searches,
and of the first batch after, or an error that says what to change: arguments of the types it takes,
one loader per mode, a batch size attribute, a strategy it runs, a loader that reads the size set."""

from __future__ import annotations

import logging
from typing import Any

import lightning.pytorch as pl
from lightning.fabric.utilities.exceptions import MisconfigurationException
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
from lightning.pytorch.utilities.data import extract_batch_size
from lightning.pytorch.utilities.parsing import _lightning_get_all_attr_holders, lightning_hasattr
from torch.nn.modules.batchnorm import _BatchNorm
from torch.utils.data import DataLoader

from batchfit.checks import check_flag, check_option, check_type
from batchfit.errors import ConfigurationError
from batchfit.integrations.lightning_plan import GlobalBatch
from batchfit.integrations.lightning_steps import loaders_of
from batchfit.options import BatchSizes, Trials
from batchfit.policy.plan.micro_batch import check_divisible

logger = logging.getLogger("batchfit.integrations.lightning")
OWNER = "BatchfitCallback"


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


def check_fit(
    trainer: pl.Trainer, pl_module: pl.LightningModule, name: str, sizes: BatchSizes, keep: bool
) -> None:
    """What the callback needs of ``fit`` (``keep``: to keep the configured global batch), or an
    error that says what to change."""
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
    check_divisible(target, trainer.world_size)
    scheduled = any(
        isinstance(callback, GradientAccumulationScheduler) for callback in getattr(trainer, "callbacks", ())
    )
    if scheduled and target is not None:
        raise ConfigurationError(
            f"sizes.global_batch_size={target} sets accumulate_grad_batches, which a "
            f"GradientAccumulationScheduler changes every epoch: remove one of the two."
        )
    if scheduled and keep:
        raise ConfigurationError(
            "a GradientAccumulationScheduler changes accumulate_grad_batches every epoch, and with it "
            "the global batch, which the callback keeps by setting accumulate_grad_batches: remove the "
            "scheduler, or pass keep_global_batch_size=False to train the batch that fits at the "
            "scheduler's accumulation."
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


class LoaderBatchSizeError(ConfigurationError):
    """The train loader's first batch does not hold the micro-batch the plan set: its DataLoader
    does not read the attribute the callback sets."""


def check_arguments(
    sizes: object, trials: object, batch_arg_name: object, eval_batch_arg_name: object, keep: object
) -> None:
    """The callback's arguments of batchfit's and Python's types, or an error saying what to pass."""
    check_option(OWNER, "sizes", sizes, BatchSizes)
    check_option(OWNER, "trials", trials, Trials)
    check_type(
        f"{OWNER}'s batch_arg_name",
        batch_arg_name,
        isinstance(batch_arg_name, str),
        "a str",
        "batch_arg_name= the name of the attribute train_dataloader() reads, such as 'batch_size'",
    )
    check_type(
        f"{OWNER}'s eval_batch_arg_name",
        eval_batch_arg_name,
        eval_batch_arg_name is None or isinstance(eval_batch_arg_name, str),
        "a str or None",
        "eval_batch_arg_name= the name of the attribute the eval loaders read, such as 'eval_batch_size'",
    )
    check_flag(f"{OWNER}'s keep_global_batch_size", keep)
    target = sizes.global_batch_size if isinstance(sizes, BatchSizes) else None  # checked above
    if keep is False and target is not None:
        raise ConfigurationError(
            f"sizes.global_batch_size={target} is the global batch to keep, and "
            f"keep_global_batch_size=False asks to change it to the batch that fits: pass one of the two."
        )


def configured_global_batch(trainer: pl.Trainer, loader: DataLoader[Any]) -> GlobalBatch:
    """The global batch the Trainer trains as configured: the train loader's batch size x
    ``accumulate_grad_batches`` x world size."""
    if loader.batch_size is None:
        raise ConfigurationError(
            "train_dataloader() returned a DataLoader with no batch_size (a batch_sampler batches it), "
            "so the global batch it trains is unknown and the callback cannot keep it. Pass "
            "sizes=batchfit.BatchSizes(global_batch_size=N) with the global batch to train, or "
            "keep_global_batch_size=False to train the batch that fits."
        )
    accumulation, world_size = trainer.accumulate_grad_batches, trainer.world_size
    samples = loader.batch_size * accumulation * world_size
    source = (
        f"the train loader's batch_size {loader.batch_size} x accumulate_grad_batches {accumulation} "
        f"x world_size {world_size}"
    )
    return GlobalBatch(samples, source, configured=True)


def check_first_batch(
    trainer: pl.Trainer, pl_module: pl.LightningModule, name: str, batch: Any, planned: int, accumulation: int
) -> None:
    """The first training batch holds the planned micro-batch (or the whole of an epoch smaller than
    it), or an error naming both sizes."""
    try:
        seen = extract_batch_size(batch)
    except MisconfigurationException:
        logger.warning("the first training batch's size cannot be read; it is not checked against the plan")
        return
    if seen == planned or (seen < planned and _one_batch(trainer.train_dataloader)):
        return
    holders = ", ".join(_holder_names(pl_module, name))
    raise LoaderBatchSizeError(
        f"the first training batch holds {seen} samples, but the plan trains micro_batch_size "
        f"{planned} x accumulation_steps {accumulation}, set as {holders}: train_dataloader() does "
        f"not build its batches from it, so each optimizer step would train {seen} x {accumulation} "
        f"samples per device. Build the train DataLoader with its batch_size read from "
        f"{holders.split(', ')[0]}, or pass batch_arg_name= the attribute it reads."
    )


def _one_batch(loader: object) -> bool:
    """Whether ``loader`` makes one batch an epoch (a dataset smaller than the batch)."""
    try:
        return isinstance(loader, DataLoader) and len(loader) == 1
    except TypeError:  # an iterable dataset without a length
        return False


def _holder_names(pl_module: pl.LightningModule, name: str) -> list[str]:
    """Where the attribute ``name`` is set: ``Classifier.hparams.batch_size``, say."""
    trainer = pl_module._trainer
    datamodule = getattr(trainer, "datamodule", None)
    names = []
    for holder in _lightning_get_all_attr_holders(pl_module, name):
        owner = pl_module if holder is pl_module or holder is pl_module.hparams else datamodule
        inner = "" if holder is owner else ".hparams"
        names.append(f"{type(owner).__name__}{inner}.{name}")
    return names


def warn_batch_norm(pl_module: pl.LightningModule, loader_batch_size: int | None, micro: int) -> None:
    """A warning where a BatchNorm layer normalises over micro-batches smaller than the loader's."""
    norms = sorted({type(layer).__name__ for layer in pl_module.modules() if isinstance(layer, _BatchNorm)})
    if norms and loader_batch_size is not None and micro != loader_batch_size:
        logger.warning(
            "%s normalises over each micro-batch: with micro_batch_size %d instead of the loader's "
            "batch_size %d its batch statistics (and so the step and its running statistics) change. "
            "GroupNorm or LayerNorm are the same at any micro-batch; or give the Trainer a loader "
            "batch that fits.",
            " and ".join(norms),
            micro,
            loader_batch_size,
        )

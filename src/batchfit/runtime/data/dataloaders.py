"""Where the data-loading check gets its DataLoaders: from the workload's map-style dataset (built
here as training builds one, shuffled by a private generator), or from the user's factory, called
with the DataLoader keywords its signature accepts."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._pytree import tree_leaves
from torch.utils.data import DataLoader, IterableDataset

from batchfit.errors import ConfigurationError
from batchfit.policy.explore.loader_settings import KNOBS, LoaderSetting
from batchfit.runtime.steps.micro_batches import plain
from batchfit.runtime.workloads.workload import Workload

LoaderFactory = Callable[..., DataLoader[Any]]


class LoaderSource:
    """DataLoaders at ``batch_size`` for any ``LoaderSetting``; ``knobs`` are the setting's fields
    this source passes on (all four for a dataset; for a factory, those its signature names, or all
    with ``**kwargs``)."""

    def __init__(self, workload: Workload, batch_size: int, factory: LoaderFactory | None = None) -> None:
        self.workload, self.batch_size, self.factory = workload, batch_size, factory
        if factory is not None:
            self.knobs = _factory_knobs(factory)
            self.description = f"loader={_name(factory)}"
            return
        if workload.dataset is None:
            raise ConfigurationError(
                f"check_data needs batches from a DataLoader, and workload {workload.name!r} makes "
                f"them with make_batch; give the Workload a map-style dataset (dataset=..., "
                f"collate_fn=...) or pass loader=a factory (batch_size=..., num_workers=...) -> "
                f"DataLoader (on the command line: --loader MODULE:FUNCTION)."
            )
        _check_dataset(workload.dataset, batch_size, "Workload.dataset")
        self.knobs = KNOBS
        self.description = "the workload's dataset"

    def check(self, setting: LoaderSetting) -> None:
        """Refuse a setting whose knobs the factory cannot be given."""
        setting.check()
        default = LoaderSetting()
        for knob in KNOBS:
            if knob not in self.knobs and getattr(setting, knob) != getattr(default, knob):
                raise ConfigurationError(
                    f"{self.description} has no {knob} parameter, so {knob}={getattr(setting, knob)!r} "
                    f"cannot be passed to it; add the parameter, or leave {knob} at its default."
                )

    def build(self, setting: LoaderSetting) -> DataLoader[Any]:
        if self.factory is None:
            return DataLoader(
                self.workload.dataset,
                batch_size=self.batch_size,
                shuffle=True,
                generator=torch.Generator().manual_seed(0),  # the user's RNG is not drawn from
                collate_fn=self.workload.collate_fn,
                drop_last=True,
                num_workers=setting.num_workers,
                pin_memory=setting.pin_memory,
                persistent_workers=setting.persistent_workers,
                prefetch_factor=setting.prefetch_factor,
            )
        keywords = {knob: getattr(setting, knob) for knob in self.knobs}
        call = ", ".join(
            f"{key}={value!r}" for key, value in {"batch_size": self.batch_size, **keywords}.items()
        )
        try:
            loader = self.factory(batch_size=self.batch_size, **keywords)
        except BaseException as error:
            error.add_note(f"batchfit: raised by {_name(self.factory)}({call}).")
            raise
        if not isinstance(loader, DataLoader):
            raise ConfigurationError(
                f"{_name(self.factory)}({call}) returned {type(loader).__name__}, not a "
                f"torch.utils.data.DataLoader."
            )
        _check_dataset(loader.dataset, self.batch_size, f"the dataset of {self.description}'s DataLoader")
        return loader

    def samples(self, batch: Any, first: bool = False) -> int:
        """The samples in ``batch`` (along the workload's batch_dim); the first batch of a loader
        must hold ``batch_size`` of them."""
        tensors = [leaf for leaf in tree_leaves(plain(batch)) if isinstance(leaf, torch.Tensor)]
        dim = self.workload.batch_dim
        if not tensors or tensors[0].dim() <= dim:
            raise ConfigurationError(
                f"{self.description} yielded a batch with no tensor along batch_dim={dim} "
                f"({type(batch).__name__}); a batch must hold tensors of batch_size samples."
            )
        found = int(tensors[0].shape[dim])
        if first and found != self.batch_size:
            raise ConfigurationError(
                f"{self.description} yielded a first batch of {found} samples, not batch_size="
                f"{self.batch_size}; its DataLoader must be built with the batch_size it is given."
            )
        return found


def batches_per_epoch(loader: DataLoader[Any]) -> int | None:
    try:
        return len(loader)
    except TypeError:  # a batch sampler without a length
        return None


def _check_dataset(dataset: Any, batch_size: int, name: str) -> None:
    if isinstance(dataset, IterableDataset):
        raise ConfigurationError(
            f"{name} is an IterableDataset ({type(dataset).__name__}): check_data measures map-style "
            f"datasets, where num_workers splits the batches between the workers (an iterable one must "
            f"shard itself per worker, or every worker yields the same samples); give it a map-style "
            f"dataset (with __len__ and __getitem__)."
        )
    length = len(dataset) if hasattr(dataset, "__len__") else None
    if length is not None and length < batch_size:
        raise ConfigurationError(
            f"{name} holds {length} items, fewer than batch_size={batch_size}: not one full batch to "
            f"time; pass batch_size <= {length}, or a larger dataset."
        )


def _factory_knobs(factory: LoaderFactory) -> tuple[str, ...]:
    if not callable(factory):
        raise ConfigurationError(
            f"loader must be a factory (batch_size=..., num_workers=..., ...) -> DataLoader, "
            f"got {type(factory).__name__}."
        )
    try:
        parameters = inspect.signature(factory).parameters
    except (TypeError, ValueError):  # no signature to read: give it every knob
        return KNOBS
    if any(parameter.kind is inspect.Parameter.VAR_KEYWORD for parameter in parameters.values()):
        return KNOBS
    if "batch_size" not in parameters:
        raise ConfigurationError(
            f"loader={_name(factory)} takes no batch_size parameter (its parameters: "
            f"({', '.join(parameters)})); check_data calls loader(batch_size=N, num_workers=N, ...) "
            f"-> DataLoader: add a batch_size parameter and build the DataLoader with it."
        )
    return tuple(knob for knob in KNOBS if knob in parameters)


def _name(factory: object) -> str:
    return str(getattr(factory, "__qualname__", None) or getattr(factory, "__name__", None) or factory)

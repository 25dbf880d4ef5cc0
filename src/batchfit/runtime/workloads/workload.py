"""What a trial runs: a model, its optimizer, a source of batches and a loss (or a step function)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

from batchfit.checks import check_callback, check_positive_int, shown, type_name
from batchfit.errors import ConfigurationError
from batchfit.runtime.distributed.buckets import BucketLayout, bucket_layout
from batchfit.runtime.distributed.data_parallel import DataParallelStandIn, bucket_bytes, unwrapped
from batchfit.runtime.distributed.sharded import local_step
from batchfit.runtime.steps.micro_batches import plain
from batchfit.runtime.workloads.batches import check_batch_size, collated, largest_first, on_host
from batchfit.runtime.workloads.default_step import call_model, model_loss, optimizer_step

#: The Workload's functions, and what each is called with (what its errors say it takes).
_FUNCTIONS = {
    "make_batch": "a batch size n and returning n samples",
    "collate_fn": "a list of dataset items",
    "size_key": "a dataset item",
    "loss_fn": "(output, target)",
    "train_step": "(model, optimizer, batch)",
    "eval_step": "(model, batch)",
}
OptimizerFactory = Callable[[Iterable[torch.nn.Parameter]], torch.optim.Optimizer]
#: What hears a step's return value (or its loss), as the step returns it: ``runtime.steps.finite``.
OnLoss = Callable[[Any], None]


@dataclass
class Workload:
    """A training (and evaluation) step to measure.

    Batches come from ``make_batch(n)`` or from ``dataset`` (with ``collate_fn``), taking the
    largest items first (by ``size_key(item)``, default: the number of tensor elements).
    The default step calls ``loss_fn(model(inputs), target)`` on a batch ``(inputs, target)``;
    without ``loss_fn`` the model's output must be the loss (or hold it as ``.loss``/``["loss"]``).
    ``train_step(model, optimizer, batch)`` and ``eval_step(model, batch)`` replace the default
    steps for anything unusual (several losses, AMP with a GradScaler, accumulation).
    A model wrapped in ``DistributedDataParallel`` is measured as it trains, its gradient buckets
    counted, while its steps run the wrapper's own module, with no collective to wait in
    (``runtime.distributed.data_parallel``): the steps are given that module as ``model``.
    """

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer | OptimizerFactory | None = None
    make_batch: Callable[[int], Any] | None = None
    dataset: Any = None
    collate_fn: Callable[[list[Any]], Any] | None = None
    size_key: Callable[[Any], float] | None = None
    loss_fn: Callable[[Any, Any], torch.Tensor] | None = None
    train_step: Callable[[torch.nn.Module, Any, Any], Any] | None = None
    eval_step: Callable[[torch.nn.Module, Any], Any] | None = None
    batch_dim: int = 0
    tokens_per_sample: int | None = None  # for throughput in tokens/s (sequence models)
    name: str = "workload"
    _order: list[int] | None = field(default=None, init=False, repr=False)
    # What the model's wrapper holds on the device beside the tensors a step reaches (DDP's
    # gradient buckets), read once: a variant that replaces the model (compiled) keeps it.
    _wrapper_bytes: int = field(default=0, init=False, repr=False)
    # How DDP lays them out, and again at training's second step (``runtime.distributed.buckets``).
    _buckets: BucketLayout = field(default=BucketLayout(), init=False, repr=False)
    # What the user's steps are given: the model as a trial runs it (``step_model``), made once.
    _data_parallel: bool = field(default=False, init=False, repr=False)
    _step_model: torch.nn.Module | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.model, torch.nn.Module):
            raise ConfigurationError(
                f"Workload.model must be a torch.nn.Module, got {type_name(self.model)}."
            )
        for name, takes in _FUNCTIONS.items():
            check_callback(f"Workload.{name}", getattr(self, name), takes)
        if isinstance(self.batch_dim, bool) or not isinstance(self.batch_dim, int):
            raise ConfigurationError(
                f"Workload.batch_dim must be an int (the dimension of a batch's tensors that holds "
                f"its samples), got {type_name(self.batch_dim)} ({shown(self.batch_dim)})."
            )
        if self.tokens_per_sample is not None:
            check_positive_int("Workload.tokens_per_sample", self.tokens_per_sample)
        if not isinstance(self.name, str):
            raise ConfigurationError(f"Workload.name must be a str, got {type_name(self.name)}.")
        if (self.make_batch is None) == (self.dataset is None):
            raise ConfigurationError(
                "Workload needs exactly one source of batches: make_batch=callable(n) or "
                "dataset=Dataset (with an optional collate_fn)."
            )
        if self.dataset is not None and not hasattr(self.dataset, "__len__"):
            raise ConfigurationError(
                "Workload.dataset must be a map-style dataset (with __len__ and __getitem__); "
                "for an iterable dataset pass make_batch=callable(n) instead."
            )
        if self.optimizer is not None and not (
            isinstance(self.optimizer, torch.optim.Optimizer) or callable(self.optimizer)
        ):
            raise ConfigurationError(
                f"Workload.optimizer must be a torch.optim.Optimizer or a factory params -> Optimizer "
                f"(e.g. lambda params: torch.optim.AdamW(params, lr=1e-3)), got "
                f"{type_name(self.optimizer)} ({shown(self.optimizer)})."
            )
        if isinstance(getattr(self.model, "_orig_mod", None), DistributedDataParallel):
            raise ConfigurationError(
                "Workload.model is a torch.compile'd DistributedDataParallel, whose every step "
                "all-reduces across the ranks: a rank that ran out of memory inside a trial would "
                "leave the others waiting. Pass the DistributedDataParallel of the compiled module "
                "(DistributedDataParallel(torch.compile(model))): batchfit runs that module, compiled, "
                "and counts DDP's gradient buckets."
            )
        self._wrapper_bytes = bucket_bytes(self.model)
        self._buckets = bucket_layout(self.model)
        self._data_parallel = isinstance(self.model, DistributedDataParallel)

    # -- batches -------------------------------------------------------------------------

    def host_batch(self, batch_size: int) -> Any:
        """A batch of ``batch_size`` samples on the host, as a data loader hands them to training
        (each step copies it to the device). A ``make_batch`` that makes its tensors on a GPU has
        them moved to the host: kept there beside each step's copy, they would count twice
        against the GPU's cap."""
        if self.make_batch is not None:
            batch = self.make_batch(batch_size)
            source = f"make_batch({batch_size})"
        else:
            if self._order is None:
                self._order = largest_first(self.dataset, self.size_key)
            batch = collated(self.dataset, self._order, batch_size, self.collate_fn)
            source = f"the collated batch of {batch_size} dataset items"
        batch = plain(batch)
        check_batch_size(batch, batch_size, self.batch_dim, source)
        return on_host(batch)

    # -- steps ---------------------------------------------------------------------------

    @property
    def module(self) -> torch.nn.Module:
        """The model the steps run: a ``DistributedDataParallel``'s own module, else the model."""
        return unwrapped(self.model)

    @property
    def step_model(self) -> torch.nn.Module:
        """What ``train_step`` and ``eval_step`` are given: ``module``, or for a model in DDP a
        stand-in with DDP's interface and no collective (``DataParallelStandIn``)."""
        if not self._data_parallel:
            return self.module
        if self._step_model is None or self._step_model.module is not self.module:
            self._step_model = DataParallelStandIn(self.module)
        return self._step_model

    @property
    def wrapper_bytes(self) -> int:
        """Bytes the model's wrapper holds on the device beside the tensors a step reaches (DDP's
        gradient buckets; 0 for a plain model): resident in every trial. A device that counts
        the tensors it is shown adds them; a GPU's allocator holds them already."""
        return self._wrapper_bytes

    @property
    def buckets(self) -> BucketLayout:
        """The layout of DDP's gradient buckets, before and after the rebuild a training trial
        reproduces (``runtime.distributed.buckets``; empty: no rebuild to come)."""
        return self._buckets

    def replaced(self, **changes: Any) -> Workload:
        """This workload with ``changes`` to its fields (a fake copy of the model, a compiled one),
        what the original model's wrapper holds still held, unless the new model is a wrapper too."""
        variant = dataclasses.replace(self, **changes)
        variant._wrapper_bytes = variant._wrapper_bytes or self._wrapper_bytes
        variant._buckets = variant._buckets if variant._data_parallel else self._buckets
        variant._data_parallel = variant._data_parallel or self._data_parallel
        return variant

    @property
    def functions(self) -> tuple[Callable[..., Any] | None, ...]:
        """The user's callables a step runs besides the model: ``train_step``, ``eval_step`` and
        ``loss_fn``, where the state they reach (GradScalers, other modules) is looked for."""
        return (self.train_step, self.eval_step, self.loss_fn)

    @property
    def compiled(self) -> tuple[str, ...]:
        """What of the model, the steps and the loss runs ``torch.compile``'d code (empty: none),
        which a CPU device measures from the allocator's events (``runtime.steps.compiled``)."""
        from batchfit.runtime.steps.compiled import (
            compiled_parts,  # it reads steps as runtime.steps.reach does
        )

        return tuple(compiled_parts(self.module, *self.functions))

    @property
    def reached(self) -> tuple[torch.nn.Module | torch.optim.Optimizer, ...]:
        """The modules and optimizers the steps reach besides the model and optimizer (a GAN's
        discriminator and its optimizer, an EMA copy): put back after each trial as the model is,
        and resident in its memory (``runtime.steps.reach.step_state``)."""
        from batchfit.runtime.steps.reach import step_state

        optimizer = self.optimizer if isinstance(self.optimizer, torch.optim.Optimizer) else None
        return tuple(step_state(self.module, optimizer, self.functions))

    def build_optimizer(self) -> torch.optim.Optimizer | None:
        """The optimizer a trial steps: the workload's, or a new one from its factory (a ZeRO
        optimizer's view that steps its shard alone: ``runtime.distributed.sharded.local_step``)."""
        if self.optimizer is None:
            return None
        if isinstance(self.optimizer, torch.optim.Optimizer):
            return local_step(self.optimizer)
        return local_step(self.optimizer(self.module.parameters()))

    def optimizer_name(self) -> str | None:
        """The class name of the optimizer the steps use (``"AdamW"``; a ZeRO optimizer's local
        one), None without one: what picks ``plan``'s learning-rate rule. A factory is called once."""
        optimizer = self.optimizer
        if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
            optimizer = optimizer(self.module.parameters())
        if optimizer is None:
            return None
        inner = getattr(optimizer, "optim", None)  # ZeroRedundancyOptimizer's local optimizer
        return type(inner if isinstance(inner, torch.optim.Optimizer) else optimizer).__name__

    def run_train_step(
        self, optimizer: torch.optim.Optimizer | None, batch: Any, on_loss: OnLoss | None = None
    ) -> None:
        """One training step on ``batch``; ``on_loss`` is given what it returns (a ``train_step``'s
        return value, the default step's loss at each backward)."""
        if self.train_step is not None:
            returned = self.train_step(self.step_model, optimizer, batch)
            if on_loss is not None:
                on_loss(returned)
            return
        if optimizer is None:
            raise ConfigurationError(
                "mode='train' needs Workload.optimizer (an Optimizer or a factory of one) "
                "or a train_step(model, optimizer, batch) function."
            )
        optimizer_step(optimizer, lambda: _told(self._loss(batch), on_loss))

    def run_eval_step(self, batch: Any, on_loss: OnLoss | None = None) -> None:
        """One evaluation step on ``batch``, without gradients; ``on_loss`` is given what it returns
        (an ``eval_step``'s return value, the loss, or the model's output)."""
        with torch.no_grad():
            if self.eval_step is not None:
                returned = self.eval_step(self.step_model, batch)
            elif self.loss_fn is not None:
                returned = self._loss(batch)
            else:
                returned = call_model(self.module, batch)
            if on_loss is not None:
                on_loss(returned)

    def _loss(self, batch: Any) -> torch.Tensor:
        return model_loss(self.module, batch, self.loss_fn)


def _told(loss: torch.Tensor, on_loss: OnLoss | None) -> torch.Tensor:
    """``loss``, given to ``on_loss`` first (while it is alive: the step frees it before the update)."""
    if on_loss is not None:
        on_loss(loss)
    return loss


#: Where a model built on the meta device is measured: ``predict`` traces its step on the CPU alone.
META_ADVICE = (
    "batchfit.predict(workload, batchfit.Targets(capacities='24GiB'), device='cpu') "
    "(batchfit predict --device cpu --capacities 24GiB)"
)


def check_model_on(model: torch.nn.Module, device: torch.device, *, meta: bool = False) -> None:
    """Every parameter and buffer of ``model`` has its shape (no lazy module waits for its first
    batch) and is on ``device`` (or, with ``meta``, on the meta device), or a ConfigurationError
    says which is not and what to do (before any work, rather than torch's error inside a step)."""
    tensors = list(model.named_parameters()) + list(model.named_buffers())
    lazy = [name for name, tensor in tensors if torch.nn.parameter.is_lazy(tensor)]
    if lazy:
        named = ", ".join(lazy[:3]) + (" ..." if len(lazy) > 3 else "")
        raise ConfigurationError(
            f"the model's {named} {'is' if len(lazy) == 1 else 'are'} not initialized yet (a lazy "
            f"module, such as nn.LazyLinear, takes its shapes from its first batch); run the model "
            f"once on a real batch (model(inputs)) before batchfit, as before training."
        )
    for name, tensor in tensors:
        if meta and tensor.is_meta:
            continue
        if tensor.is_meta:
            raise ConfigurationError(
                f"the model's {name} is on the meta device, which holds shapes but no memory, so no "
                f"step runs on {device}; predict its batch sizes from the shapes alone with "
                f"{META_ADVICE}, or build the model on {device.type} to measure it there."
            )
        if tensor.device.type != device.type or (device.index is not None and tensor.device != device):
            raise ConfigurationError(
                f"the model's {name} is on {tensor.device}, but batchfit runs on {device}; move "
                f"the model there first (model.to('{device}')), or pass device='{tensor.device.type}'."
            )

"""What a trial runs: a model, its optimizer, a source of batches and a loss (or a step function)."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel
from torch.utils._pytree import tree_leaves, tree_map

from batchfit.errors import ConfigurationError
from batchfit.runtime.distributed.data_parallel import DataParallelStandIn, bucket_bytes, unwrapped
from batchfit.runtime.distributed.sharded import local_step
from batchfit.runtime.steps.micro_batches import plain

OptimizerFactory = Callable[[Iterable[torch.nn.Parameter]], torch.optim.Optimizer]
#: Items scanned to find the largest samples of a dataset; larger datasets are sampled.
MAX_SCANNED_ITEMS = 10_000


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
    # What the user's steps are given: the model as a trial runs it (``step_model``), made once.
    _data_parallel: bool = field(default=False, init=False, repr=False)
    _step_model: torch.nn.Module | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.model, torch.nn.Module):
            raise ConfigurationError(
                f"Workload.model must be a torch.nn.Module, got {type(self.model).__name__}."
            )
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
                "Workload.optimizer must be a torch.optim.Optimizer or a factory "
                "params -> Optimizer (e.g. lambda params: torch.optim.AdamW(params, lr=1e-3))."
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
            order = self._largest_first()
            items = [self.dataset[order[i % len(order)]] for i in range(batch_size)]
            source = f"the collated batch of {batch_size} dataset items"
            if self.collate_fn is not None:
                batch = self.collate_fn(items)  # the user's own: its errors are theirs, unchanged
            else:
                try:
                    batch = torch.utils.data.default_collate(items)
                except (RuntimeError, TypeError, ValueError) as error:
                    raise ConfigurationError(
                        f"torch's default_collate could not make a batch of {batch_size} dataset "
                        f"items ({error}); items of different sizes (token lists of varying length) "
                        f"need a collate_fn that pads them: pass Workload(collate_fn=...), the one "
                        f"your training DataLoader uses."
                    ) from error
        batch = plain(batch)
        self._check_size(batch, batch_size, source)
        return tree_map(
            lambda leaf: (
                leaf.cpu() if isinstance(leaf, torch.Tensor) and leaf.device.type == "cuda" else leaf
            ),
            batch,
        )

    def _largest_first(self) -> list[int]:
        if self._order is None:
            length = len(self.dataset)
            if length == 0:
                raise ConfigurationError("Workload.dataset is empty; it needs at least one item.")
            indices = list(range(length))
            if length > MAX_SCANNED_ITEMS:  # a private RNG: the user's random state is untouched
                indices = random.Random(0).sample(indices, MAX_SCANNED_ITEMS)
            key = self.size_key or _item_size
            self._order = sorted(indices, key=lambda index: -key(self.dataset[index]))
        return self._order

    def _check_size(self, batch: Any, batch_size: int, source: str) -> None:
        leaves = tree_leaves(batch)
        tensors = [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]
        if not tensors:
            arrays = [type(leaf).__name__ for leaf in leaves if hasattr(leaf, "__array__")]
            held = f" ({arrays[0]}: convert it with torch.from_numpy or torch.as_tensor)" if arrays else ""
            raise ConfigurationError(f"{source} returned no tensors{held}; a batch must hold tensors.")
        first = tensors[0]
        found = first.shape[self.batch_dim] if first.dim() > self.batch_dim else None
        if found != batch_size:
            raise ConfigurationError(
                f"{source} returned a batch of {found} samples (its first tensor has shape "
                f"{tuple(first.shape)}, batch_dim={self.batch_dim}), not {batch_size}; "
                f"make_batch(n) must return exactly n samples along batch_dim."
            )

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

    def replaced(self, **changes: Any) -> Workload:
        """This workload with ``changes`` to its fields (a fake copy of the model, a compiled one),
        what the original model's wrapper holds still held, unless the new model is a wrapper too."""
        variant = dataclasses.replace(self, **changes)
        variant._wrapper_bytes = variant._wrapper_bytes or self._wrapper_bytes
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

    def run_train_step(self, optimizer: torch.optim.Optimizer | None, batch: Any) -> None:
        if self.train_step is not None:
            self.train_step(self.step_model, optimizer, batch)
            return
        if optimizer is None:
            raise ConfigurationError(
                "mode='train' needs Workload.optimizer (an Optimizer or a factory of one) "
                "or a train_step(model, optimizer, batch) function."
            )
        optimizer_step(optimizer, lambda: self._loss(batch))

    def run_eval_step(self, batch: Any) -> None:
        with torch.no_grad():
            if self.eval_step is not None:
                self.eval_step(self.step_model, batch)
            elif self.loss_fn is not None:
                self._loss(batch)
            else:
                _call(self.module, batch)

    def _loss(self, batch: Any) -> torch.Tensor:
        return model_loss(self.module, batch, self.loss_fn)


def needs_closure(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer.step`` must be given a closure that recomputes the loss (L-BFGS: it
    evaluates the loss several times per step), rather than taking one as an option. Asked at
    every step: read once per optimizer class (a signature takes 10 us), unless the instance has
    a step of its own."""
    own = vars(optimizer).get("step")
    if own is not None:
        return _requires_closure(own)
    cls: type = type(optimizer)
    if cls not in _CLASS_NEEDS_CLOSURE:
        _CLASS_NEEDS_CLOSURE[cls] = _requires_closure(optimizer.step)
    return _CLASS_NEEDS_CLOSURE[cls]


_CLASS_NEEDS_CLOSURE: dict[type, bool] = {}


def _requires_closure(step: Callable[..., Any]) -> bool:
    closure = inspect.signature(step).parameters.get("closure")
    return closure is not None and closure.default is inspect.Parameter.empty


def check_steps_on_gradients(optimizer: torch.optim.Optimizer, owner: str) -> None:
    """A ConfigurationError where ``owner``, which steps ``optimizer`` on gradients it accumulated,
    is given one that needs a closure (``needs_closure``)."""
    if needs_closure(optimizer):
        raise ConfigurationError(
            f"{owner} steps the optimizer once on the gradients its micro-batches accumulated, but "
            f"{type(optimizer).__name__}.step needs a closure that recomputes the loss; use an optimizer "
            f"that steps on gradients (SGD, AdamW, ...), or step {type(optimizer).__name__} on the whole "
            f"batch yourself."
        )


def optimizer_step(
    optimizer: torch.optim.Optimizer, loss: Callable[[], torch.Tensor], *, times: int = 1
) -> None:
    """One training step of ``optimizer``: gradients cleared, ``times`` backwards of ``loss()``
    (each scaled by ``1 / times``: gradient accumulation), then the update. An optimizer that
    needs a closure (``needs_closure``) gets one that does the clearing and backwards, as often as
    it asks."""

    def backward(read: bool) -> float:
        """Clear the gradients and run the backwards; the mean loss where ``read`` (the closure's
        value: reading it waits for the device, so only an optimizer that asks for it does)."""
        optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for _ in range(times):
            value = loss()
            (value / times if times > 1 else value).backward()
            total += float(value.detach()) / times if read else 0.0
        return total

    if needs_closure(optimizer):
        optimizer.step(functools.partial(backward, True))
    else:
        backward(False)
        optimizer.step()


#: What a loss that is not a scalar tensor is told to be.
SCALAR_LOSS = (
    "reduce it (reduction='mean', as nn.CrossEntropyLoss does by default) and keep it a tensor "
    "(not .item() or float()): backward starts from it."
)


def scalar_loss(value: Any, source: str, hint: str = SCALAR_LOSS) -> torch.Tensor:
    """``value`` where it is a scalar tensor, else a ConfigurationError naming ``source`` (the
    function that returned it), what it returned, and ``hint``."""
    if isinstance(value, torch.Tensor) and value.dim() == 0:
        return value
    found = (
        f"a tensor of shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) else type(value).__name__
    )
    raise ConfigurationError(f"{source} returned {found}, not a scalar loss; {hint}")


def model_loss(
    model: torch.nn.Module,
    batch: Any,
    loss_fn: Callable[[Any, Any], torch.Tensor] | None,
    *,
    owner: str = "Workload",
    custom: str = "train_step",
    hint: str = SCALAR_LOSS,
) -> torch.Tensor:
    """The default step's loss: ``loss_fn(model(inputs), target)`` on a batch ``(inputs, target)``,
    else the model's output (or its ``.loss``/``["loss"]``). Errors name ``owner(loss_fn=...)`` and
    ``custom=...``, the parameters that replace this default; a ``loss_fn`` that returns no scalar
    tensor is told ``hint``."""
    if loss_fn is not None:
        if not (isinstance(batch, Sequence) and len(batch) == 2):
            raise ConfigurationError(
                f"with loss_fn, a batch must be a pair (inputs, target), got "
                f"{type(batch).__name__}; pass {custom}=... for other layouts."
            )
        inputs, target = batch
        return scalar_loss(loss_fn(_call(model, inputs), target), "loss_fn", hint)
    output = _call(model, batch)
    loss = output.get("loss") if isinstance(output, dict) else getattr(output, "loss", output)
    if not (isinstance(loss, torch.Tensor) and loss.dim() == 0):
        raise ConfigurationError(
            f"the model returned {type(output).__name__}, not a scalar loss; pass "
            f"{owner}(loss_fn=...) or {custom}=... so batchfit can compute one."
        )
    return loss


def _call(model: torch.nn.Module, inputs: Any) -> Any:
    if isinstance(inputs, Mapping):
        return model(**inputs)
    if isinstance(inputs, (tuple, list)):
        return model(*inputs)
    return model(inputs)


def _item_size(item: Any) -> float:
    """Default size of a dataset item: its tensor elements (and lengths of strings and lists)."""
    total = 0
    for leaf in tree_leaves(item):
        if isinstance(leaf, torch.Tensor):
            total += leaf.numel()
        elif hasattr(leaf, "shape") and hasattr(leaf, "size"):  # numpy arrays
            total += int(leaf.size)
        elif isinstance(leaf, (str, bytes)):
            total += len(leaf)
    return total


def to_device(batch: Any, device: torch.device, *, non_blocking: bool = False) -> Any:
    """Copy every tensor of ``batch`` to ``device`` as training does: a new, compact copy
    (``non_blocking`` from pinned host memory, as a loader with pin_memory=True allows)."""
    return tree_map(
        lambda leaf: (
            leaf.to(device, copy=True, non_blocking=non_blocking) if isinstance(leaf, torch.Tensor) else leaf
        ),
        plain(batch),
    )


def check_model_on(model: torch.nn.Module, device: torch.device) -> None:
    """Every parameter and buffer of ``model`` has its shape (no lazy module waits for its first
    batch) and is on ``device``, or a ConfigurationError says which is not and what to do (before
    any work, rather than torch's error inside a step)."""
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
        if tensor.device.type != device.type or (device.index is not None and tensor.device != device):
            raise ConfigurationError(
                f"the model's {name} is on {tensor.device}, but batchfit runs on {device}; move "
                f"the model there first (model.to('{device}')), or pass device='{tensor.device.type}'."
            )

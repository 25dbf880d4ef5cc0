"""The Hugging Face Trainer's own step as a ``batchfit.Workload``: its ``training_step``, gradient
clipping, optimizer and scheduler (as ``create_optimizer`` and ``create_scheduler`` make them), its
``prediction_step``, the model as accelerate prepares it (mixed precision, DDP), and its collator
applied to the longest examples of its datasets."""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from accelerate.optimizer import AcceleratedOptimizer
from accelerate.utils import convert_to_fp32, get_mixed_precision_context_manager
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils._pytree import tree_map

from batchfit.errors import ConfigurationError
from batchfit.runtime.steps.micro_batches import count_samples
from batchfit.runtime.workloads.batches import largest_first
from batchfit.runtime.workloads.workload import Workload

#: ``training_step(model, inputs, num_items_in_batch)`` and ``prediction_step(model, inputs,
#: prediction_loss_only)`` as the Trainer's class defines them (not batchfit's out-of-memory handling).
TrainingStep = Callable[..., torch.Tensor]
PredictionStep = Callable[..., Any]


class AsPrepared(nn.Module):
    """The model as ``Accelerator.prepare_model`` runs it in mixed precision: its forward under the
    accelerator's autocast and its outputs made fp32, without patching the user's model."""

    def __init__(self, model: nn.Module, accelerator: Any) -> None:
        super().__init__()
        self.module = model
        self.accelerator = accelerator

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        accelerator = self.accelerator
        with get_mixed_precision_context_manager(accelerator.native_amp, accelerator.autocast_handler):
            outputs = self.module(*args, **kwargs)
        return convert_to_fp32(outputs)


class TrainerSteps:
    """The Trainer's training and evaluation steps, as a trial runs them: ``train`` is one optimizer
    step (the loop's ``training_step``, clipping to ``max_grad_norm``, the optimizer and scheduler
    steps, ``zero_grad``); ``eval`` is ``prediction_step`` as ``evaluate`` calls it.

    A trial at micro-batch ``b`` runs it as the loop would reach the per-device batch asked, with
    ``ceil(per_device_batch_size / b)`` batches per optimizer step: where that is more than one,
    twice (the second batch runs beside the first one's gradients, as every later one does), and
    all of them held on the device with the next one (the loop fetches an optimizer step's batches
    first, and accelerate's loader places the next batch before a step begins). An eval step inside
    training also holds the last optimizer step's training batches and the next one
    (``hold_in_evaluation``, once the training sizes are known).
    """

    def __init__(
        self,
        trainer: Any,
        training_step: TrainingStep,
        prediction_step: PredictionStep,
        scheduler: Any,
        per_device_batch_size: int,
        training_batches: LongestBatches,
    ) -> None:
        self.trainer = trainer
        # Held here so that the search finds the GradScaler (fp16 on CUDA): it puts the scale back
        # after each trial and takes the optimizer steps the scaler skips for overflow as such.
        self.scaler = getattr(trainer.accelerator, "scaler", None)
        self.training_step = training_step
        self.prediction_step = prediction_step
        self.scheduler = scheduler
        self.per_device_batch_size = per_device_batch_size
        self.training_batches = training_batches
        self.held_in_evaluation: tuple[Any, int] = (None, 0)

    def hold_in_evaluation(self, micro_batch_size: int, accumulation_steps: int) -> None:
        """Evaluation inside training at these sizes holds the last optimizer step's batches, and
        the next one: the longest batches of ``micro_batch_size``."""
        self.held_in_evaluation = (self.training_batches(micro_batch_size), accumulation_steps + 1)

    def train(self, model: nn.Module, optimizer: torch.optim.Optimizer, batch: Any) -> None:
        trainer = self.trainer
        accumulation = math.ceil(self.per_device_batch_size / _samples(batch))
        held = [_clone(batch) for _ in range(accumulation)]
        _, num_items_in_batch = trainer.get_batch_samples(iter([batch]), 1, trainer.args.device)
        for _ in range(min(accumulation, 2)):
            self.training_step(model, batch, num_items_in_batch)
        max_norm = trainer.args.max_grad_norm
        # The loop takes the gradients' norm whether it clips or not (inf: no clipping).
        trainer.accelerator.clip_grad_norm_(model.parameters(), max_norm if max_norm > 0 else float("inf"))
        scaler = self.scaler  # fp16: the optimizer steps through it, as accelerate's does
        if scaler is None:
            optimizer.step()
        else:
            scaler.step(optimizer)
            scaler.update()
        self.scheduler.step()
        model.zero_grad(set_to_none=True)
        del held

    def eval(self, model: nn.Module, batch: Any) -> None:
        trainer = self.trainer
        training, count = self.held_in_evaluation
        held = [_clone(training) for _ in range(count)] + [_clone(batch)]  # and the eval loader's next
        loss_only = trainer.compute_metrics is None or bool(trainer.args.prediction_loss_only)
        self.prediction_step(model, batch, loss_only)
        del held


@contextlib.contextmanager
def trainer_workload(
    trainer: Any, training_step: TrainingStep, prediction_step: PredictionStep, per_device_batch_size: int
) -> Iterator[tuple[Workload, TrainerSteps]]:
    """The Trainer's step as a Workload over its training set, for the block, and its steps; the
    Trainer is left as it was found (its optimizer and scheduler, the attributes a step reads), and
    the DDP that holds the gradient buckets of a run on several processes is dropped."""
    with _stepping(trainer):
        optimizer, scheduler = _optimizer_and_scheduler(trainer)
        batches = LongestBatches(*loader_data(trainer, trainer.train_dataset, "training"))
        steps = TrainerSteps(
            trainer, training_step, prediction_step, scheduler, per_device_batch_size, batches
        )
        workload = Workload(
            model=_as_trained(trainer),
            optimizer=optimizer,
            make_batch=batches,
            train_step=steps.train,
            eval_step=steps.eval,
            name=type(trainer.model).__name__,
        )
        yield workload, steps


class LongestBatches:
    """``batches(n)``: the collator applied to the ``n`` longest examples, the last of them swapped for
    the shortest: a batch padded to the longest that holds padding too, as the loader's batches do
    (a model may skip its attention mask where a batch holds none, and need less memory)."""

    def __init__(self, dataset: Any, collate_fn: Callable[[list[Any]], Any]) -> None:
        self.dataset, self.collate_fn = dataset, collate_fn
        self.order = largest_first(dataset, tokens)

    def __call__(self, batch_size: int) -> Any:
        longest = [self.order[index % len(self.order)] for index in range(max(batch_size - 1, 1))]
        shortest = [self.order[-1]] if batch_size > 1 else []
        return self.collate_fn([self.dataset[index] for index in longest + shortest])


def loader_data(trainer: Any, dataset: Any, description: str) -> tuple[Any, Any]:
    """``dataset`` and the collator as the Trainer's loader pairs them (``_get_dataloader``): the
    columns the model does not take removed from a ``datasets.Dataset``, else by the collator;
    ``description`` (``training``, ``evaluation``) names the dataset in errors."""
    if dataset is None:
        raise ConfigurationError(
            f"the Trainer has no {description} dataset; batchfit collates its longest examples to "
            f"fit the batch sizes, so pass it to the Trainer (train_dataset=...)."
        )
    iterable = isinstance(dataset, torch.utils.data.IterableDataset)
    if iterable or not (hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")):
        raise ConfigurationError(
            f"the Trainer's {description} dataset ({type(dataset).__name__}) is not a map-style dataset "
            f"with a length; batchfit collates its longest examples, so it needs one (a datasets.Dataset, "
            f"a torch Dataset with __len__, a list). For an IterableDataset, set the batch sizes yourself "
            f"and train with the plain Trainer."
        )
    if _is_datasets_dataset(dataset):
        return trainer._remove_unused_columns(dataset, description=description), trainer.data_collator
    return dataset, trainer._get_collator_with_removed_columns(trainer.data_collator, description=description)


def tokens(item: Any) -> float:
    """An example's size: the elements of its tensors and the lengths of its lists (token ids), so
    the longest examples make the first batches."""
    values = list(item.values()) if isinstance(item, Mapping) else item
    if not isinstance(values, list | tuple):
        values = [values]
    total = 0
    for value in values:
        if isinstance(value, torch.Tensor):
            total += value.numel()
        elif hasattr(value, "size") and hasattr(value, "shape"):  # a numpy array
            total += int(value.size)
        elif isinstance(value, list | tuple | str):
            total += len(value)
    return float(total)


def enable_checkpointing(trainer: Any) -> None:
    """Activation checkpointing switched on as ``Trainer.train`` switches it on before its loop
    (``activation_checkpointing`` or its older name ``gradient_checkpointing``), so the search
    measures the step that trains; ``train`` switches it on again, to the same effect."""
    args = trainer.args
    names = ("activation_checkpointing", "gradient_checkpointing")
    if not any(getattr(args, name, False) for name in names):
        return
    options = dict(
        getattr(args, "activation_checkpointing_kwargs", None)
        or getattr(args, "gradient_checkpointing_kwargs", None)
        or {}
    )
    every_n_layers, offload = options.pop("every_n_layers", 1), options.pop("offload", False)
    model = trainer.model
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(
            activation_checkpointing_kwargs=options or None, every_n_layers=every_n_layers, offload=offload
        )
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=options or None)


def _clone(batch: Any) -> Any:
    """A copy of ``batch``'s tensors: accelerate's loader fetches one batch ahead (to know the last),
    and places it on the device, so two batches are there while a step runs."""
    return tree_map(lambda leaf: leaf.clone() if isinstance(leaf, torch.Tensor) else leaf, batch)


def _samples(batch: Any) -> int:
    return count_samples(batch, 0)


def _is_datasets_dataset(dataset: Any) -> bool:
    datasets = sys.modules.get("datasets")  # not imported: no datasets.Dataset exists
    return datasets is not None and isinstance(dataset, datasets.Dataset)


def _as_trained(trainer: Any) -> nn.Module:
    """The model as the Trainer's accelerator runs it: in mixed precision as it prepares it, and on
    several processes in the DDP it wraps it in (whose gradient buckets a search counts)."""
    accelerator = trainer.accelerator
    model: nn.Module = AsPrepared(trainer.model, accelerator) if accelerator.native_amp else trainer.model
    if trainer.args.world_size <= 1:
        return model
    handler = accelerator.ddp_handler
    kwargs = handler.to_kwargs() if handler is not None else {}
    if accelerator.device.type == "cuda":
        kwargs = {**kwargs, "device_ids": [accelerator.local_process_index]}
    return DistributedDataParallel(model, **kwargs)


def _optimizer_and_scheduler(trainer: Any) -> tuple[torch.optim.Optimizer, Any]:
    """The optimizer the Trainer would make (``create_optimizer``; the one given to it, if it was)
    and the scheduler ``create_scheduler`` makes on it; accelerate's wrapper is left out (the step
    goes through the GradScaler itself), so a trial's optimizer is the one it snapshots."""
    optimizer = trainer.optimizer
    if optimizer is None:
        optimizer = trainer.create_optimizer()
    if isinstance(optimizer, AcceleratedOptimizer):
        optimizer = optimizer.optimizer
    trainer.optimizer = optimizer  # what training_step reads (schedule-free's train()), until put back
    scheduler = trainer.lr_scheduler
    if scheduler is None:
        scheduler = trainer.create_scheduler(max(trainer.args.max_steps, 1), optimizer=optimizer)
    return optimizer, scheduler


@contextlib.contextmanager
def _stepping(trainer: Any) -> Iterator[None]:
    """The Trainer as its loop leaves it for one step of one batch (no accumulation, the gradients
    synchronised, the loss's token count this process's own: no collective inside a trial), then
    put back: its optimizer and scheduler (the search makes its own), and those attributes."""
    names = ("optimizer", "lr_scheduler", "_created_lr_scheduler", "current_gradient_accumulation_steps")
    saved = {name: getattr(trainer, name, None) for name in names}
    had_steps = hasattr(trainer, "current_gradient_accumulation_steps")
    averaging = trainer.args.average_tokens_across_devices
    gradient_state = trainer.accelerator.gradient_state
    synchronised = gradient_state.sync_gradients
    trainer.current_gradient_accumulation_steps = 1
    trainer.args.average_tokens_across_devices = False
    gradient_state._set_sync_gradients(True)
    try:
        yield
    finally:
        gradient_state._set_sync_gradients(synchronised)
        trainer.args.average_tokens_across_devices = averaging
        for name, value in saved.items():
            setattr(trainer, name, value)
        if not had_steps:
            del trainer.current_gradient_accumulation_steps

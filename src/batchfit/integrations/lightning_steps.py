"""The steps Lightning's Trainer runs, as a ``batchfit.Workload``: the module's ``training_step``
under the Trainer's precision plugin, its loss normalised over the accumulation, then zero_grad,
backward, gradient clipping and the optimizer step through Lightning's own hooks; the module's
``validation_step`` / ``test_step`` as the evaluation loop runs it; batches as its DataLoader
collates them. ``batchfit.integrations.lightning`` searches these; nothing here searches."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, Literal

import lightning.pytorch as pl
import torch
from lightning.pytorch.core.optimizer import LightningOptimizer
from lightning.pytorch.loops.fit_loop import _FitLoop
from lightning.pytorch.loops.optimization.automatic import ClosureResult
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.trainer import call
from lightning.pytorch.trainer.connectors.logger_connector.result import _ResultCollection
from lightning.pytorch.utilities import CombinedLoader
from lightning.pytorch.utilities.signature_utils import is_param_in_hook_signature
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._pytree import tree_leaves
from torch.utils.data import DataLoader, IterableDataset

from batchfit.runtime.workloads.workload import Workload

#: Micro-batches a measured step runs of an accumulation's: the first (its gradients made anew)
#: and the second (accumulated into the resident ones); the third and later repeat the second.
MICRO_BATCHES_MEASURED = 2

EvalHook = Literal["validation_step", "test_step"]


@dataclass(frozen=True)
class LightningSteps:
    """The Trainer's train and eval steps on the module a trial hands them (the LightningModule,
    or DDP's stand-in for it, whose ``.module`` it is); ``accumulation_steps`` as the run trains
    (the loss is divided by it), of which a step runs ``MICRO_BATCHES_MEASURED`` at most."""

    trainer: pl.Trainer
    #: Held here so that the search finds its GradScaler (16-mixed on CUDA) and puts it back.
    precision: Precision
    accumulation_steps: int
    eval_hook: EvalHook
    #: Validation inside fit runs after the module's gradients are zeroed (Lightning's
    #: ``on_validation_model_zero_grad``); validate() and test() hold no training state.
    eval_in_fit: bool

    def train(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: Any) -> None:
        """One optimizer step of automatic optimization, as Lightning's fit loop runs it."""
        module = self._module(model)
        batch = module._apply_batch_transfer_handler(batch, dataloader_idx=0)
        runs = min(self.accumulation_steps, MICRO_BATCHES_MEASURED)
        for index in range(runs - 1):  # the micro-batches before the step: no optimizer step
            self._closure(module, optimizer, batch, index)()
        last = self.accumulation_steps - 1 if runs > 1 else 0
        stepping = LightningOptimizer._to_lightning_optimizer(optimizer, self.trainer.strategy)
        closure = self._closure(module, optimizer, batch, last)
        epoch = self.trainer.current_epoch
        call._call_lightning_module_hook(
            self.trainer, "optimizer_step", epoch, last, stepping, closure, pl_module=module
        )

    def eval(self, model: torch.nn.Module, batch: Any) -> None:
        """One ``validation_step`` (or ``test_step``), as Lightning's evaluation loop runs it."""
        module = self._module(model)
        batch = module._apply_batch_transfer_handler(batch, dataloader_idx=0)
        if self.eval_in_fit:
            call._call_lightning_module_hook(self.trainer, "on_validation_model_zero_grad", pl_module=module)
        context = (
            self.precision.val_step_context()
            if self.eval_hook == "validation_step"
            else self.precision.test_step_context()
        )
        with _evaluation_mode(self.trainer), context:
            _run_hook(self.trainer, module, self.eval_hook, batch, 0)

    def _module(self, model: torch.nn.Module) -> pl.LightningModule:
        """The LightningModule a trial hands the step (or DDP's stand-in holds as ``.module``),
        attached to the Trainer. The forecast's fake copy is not (a LightningModule's copy leaves
        its Trainer behind): attached, it runs the step as the module does, the hooks that Lightning
        routes through the Trainer acting on the fake batch and optimizer they are handed."""
        module = model if isinstance(model, pl.LightningModule) else getattr(model, "module", None)
        if not isinstance(module, pl.LightningModule):
            raise TypeError(
                f"expected a LightningModule, or DDP's stand-in for one; got {type(model).__name__}"
            )
        if module._trainer is None:
            module.trainer = self.trainer
        return module

    def _closure(
        self, module: pl.LightningModule, optimizer: torch.optim.Optimizer, batch: Any, batch_idx: int
    ) -> Callable[[], torch.Tensor | None]:
        """Lightning's closure: the training step, zero_grad on an accumulation's first batch, backward."""
        trainer, precision = self.trainer, self.precision

        def closure() -> torch.Tensor | None:
            with precision.train_step_context():
                output = _run_hook(trainer, module, "training_step", batch, batch_idx)
            loss = ClosureResult.from_training_step_output(output, self.accumulation_steps).closure_loss
            if loss is None:  # the step was skipped
                return None
            if batch_idx % self.accumulation_steps == 0:
                call._call_callback_hooks(trainer, "on_before_zero_grad", optimizer)
                call._call_lightning_module_hook(trainer, "on_before_zero_grad", optimizer, pl_module=module)
                call._call_lightning_module_hook(
                    trainer,
                    "optimizer_zero_grad",
                    trainer.current_epoch,
                    batch_idx,
                    optimizer,
                    pl_module=module,
                )
            # The strategy's backward without its pre/post hooks: DDP's would arm its reducer,
            # whose all-reduce a rank out of memory would leave the others waiting in.
            loss = precision.pre_backward(loss, module)
            precision.backward(loss, module, optimizer)
            return precision.post_backward(loss, module)

        return closure


def _run_hook(trainer: pl.Trainer, module: pl.LightningModule, name: str, batch: Any, batch_idx: int) -> Any:
    """``module.<name>(batch, batch_idx)`` as the loops call it (without ``batch_idx`` where the
    hook takes none), with ``self.log`` managed: the hook's name is the current one."""
    hook = getattr(module, name)
    arguments = (batch, batch_idx) if is_param_in_hook_signature(hook, "batch_idx", min_args=2) else (batch,)
    results = trainer._results
    if results is not None:  # what self.log reads its batch size from, as the loop sets it
        results.batch, results.batch_size = batch, None
    return call._call_lightning_module_hook(trainer, name, *arguments, pl_module=module)


def _evaluation_mode(trainer: pl.Trainer) -> AbstractContextManager[Any]:
    """No autograd as the evaluation loop runs: inference mode unless the Trainer turned it off."""
    return torch.inference_mode() if trainer._evaluation_loop.inference_mode else nullcontext()


class _UnsyncedResults(_ResultCollection):
    """What ``self.log`` writes into during the search: the loop's own collection is left as it
    was, and ``sync_dist`` is not honoured, so no rank waits in a collective for one out of memory."""

    def log(self, fx: str, name: str, value: Any, *args: Any, **kwargs: Any) -> None:
        if any(isinstance(leaf, FakeTensor) for leaf in tree_leaves(value)):
            return  # the forecast's trace: a few bytes of logged scalars, and torchmetrics cannot take fakes
        kwargs["sync_dist"] = False
        super().log(fx, name, value, *args, **kwargs)


@contextmanager
def scratch_logging(trainer: pl.Trainer) -> Iterator[None]:
    """The active loop's result collection swapped for a scratch one while the search runs."""
    loop = trainer._active_loop
    holder = loop.epoch_loop if isinstance(loop, _FitLoop) else loop
    saved = None if holder is None else holder._results
    if holder is None or saved is None:
        yield
        return
    holder._results = _UnsyncedResults(training=saved.training)
    try:
        yield
    finally:
        holder._results = saved


def loader_batches(
    trainer: pl.Trainer, module: pl.LightningModule, loader: DataLoader[Any]
) -> dict[str, Any]:
    """The ``Workload`` keywords of the batches ``loader`` makes, as the loop prepares them on the
    host (the precision plugin's ``convert_input``, then ``on_before_batch_transfer``): a
    map-style dataset with the loader's collate (the largest items first), else the first ``n``
    items an iterable dataset yields."""
    precision, collate = trainer.precision_plugin, loader.collate_fn

    def prepared(items: list[Any]) -> Any:
        return module._on_before_batch_transfer(precision.convert_input(collate(items)), dataloader_idx=0)

    dataset = loader.dataset
    if not isinstance(dataset, IterableDataset) and hasattr(dataset, "__len__"):
        return {"dataset": dataset, "collate_fn": prepared}

    def make_batch(n: int) -> Any:
        return prepared(list(itertools.islice(iter(dataset), n)))

    return {"make_batch": make_batch}


def lightning_workload(
    trainer: pl.Trainer,
    loader: DataLoader[Any],
    steps: LightningSteps,
    optimizer: torch.optim.Optimizer | None,
) -> Workload:
    """The workload of the Trainer's steps on ``loader``'s batches: the model as the strategy
    holds it (in DDP: its buckets counted, its module run), the optimizer from
    ``configure_optimizers`` (None outside fit)."""
    module = trainer.lightning_module
    model = trainer.strategy.model
    return Workload(
        model if isinstance(model, torch.nn.Module) else module,
        optimizer,
        train_step=steps.train if optimizer is not None else None,  # validate() and test() train nothing
        eval_step=steps.eval,
        name=type(module).__name__,
        **loader_batches(trainer, module, loader),
    )


def loaders_of(loaders: Any) -> list[DataLoader[Any]]:
    """The DataLoaders a data hook returned: one, or several in a list, dict or CombinedLoader."""
    if isinstance(loaders, CombinedLoader):
        loaders = loaders.flattened
    if isinstance(loaders, Mapping):
        return [inner for value in loaders.values() for inner in loaders_of(value)]
    if isinstance(loaders, (list, tuple)):
        return [inner for value in loaders for inner in loaders_of(value)]
    return [loaders] if isinstance(loaders, DataLoader) else []

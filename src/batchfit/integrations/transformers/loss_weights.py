"""How a micro-batch's loss counts in the optimizer step (``LossWeights``), so that batchfit's
micro-batches give the step of the user's own ``per_device_train_batch_size`` x
``gradient_accumulation_steps``. The Trainer adds the losses of an optimizer step's batches,
divided by their count or not by its own rule; how one batch's loss adds up over its samples is
the loss's own (a mean over the batch, a sum, a sum divided by ``num_items_in_batch``), so it is
read from the loss itself, on two training examples, before batchfit changes the batch."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import torch

from batchfit.errors import BatchfitError
from batchfit.runtime.steps.micro_batches import micro_batch
from batchfit.runtime.steps.saved import RngState

#: ``additive``: a batch's loss is the sum of its parts' (a sum, or a sum divided by the
#: ``num_items_in_batch`` of the whole optimizer step); ``mean``: the mean of its samples' losses.
TrainerReduction = Literal["additive", "mean"]

#: How close the probe's losses must be to a reduction's (relative), to read it as that one.
TOLERANCE = 1e-4


class LossReductionError(BatchfitError, ValueError):
    """The Trainer's loss does not add up over a batch's samples in a way batchfit can weight, so it
    cannot split the batch without changing the optimizer step; the message says what it found."""


@dataclass(frozen=True)
class LossWeights:
    """The user's batch (``per_device_train_batch_size``, what the TrainingArguments asked before
    batchfit changed them) and how the loss adds up over it (None where it could not be read:
    ``finding`` says what the probe saw)."""

    per_device_train_batch_size: int
    reduction: TrainerReduction | None
    finding: str

    def cut(self, start: int, samples: int, group_samples: int) -> list[int]:
        """The micro-batch of ``samples`` from sample ``start`` of an optimizer step of
        ``group_samples``, cut where the user's last, shorter batch of the step begins (under a mean
        its samples weigh more: each batch's mean is over its own samples)."""
        asked = self.per_device_train_batch_size
        boundary = group_samples - group_samples % asked
        if self.reduction != "mean" or not start < boundary < start + samples:
            return [samples]
        return [boundary - start, start + samples - boundary]

    def scale(self, start: int, samples: int, group_samples: int, context: str) -> tuple[int, float]:
        """For the micro-batch of ``samples`` from sample ``start`` of an optimizer step of
        ``group_samples`` on this device (inside one of the user's batches where the weight
        depends on it: ``cut``): the accumulation steps the Trainer divides by (where its own rule
        divides: the user's batches in the step) and the weight of its loss. ``context`` says
        why the micro-batch is not the user's batch, for the refusal."""
        asked = self.per_device_train_batch_size
        batches = math.ceil(group_samples / asked)
        first = (start // asked) * asked
        own = min(asked, group_samples - first)  # the user's batch holding the micro-batch's first sample
        if start == first and samples == own:  # it is one of the user's batches, as the user runs it
            return batches, 1.0
        if self.reduction is None:
            raise self.refusal(
                f"batchfit would run samples {start} to {start + samples - 1} of an optimizer step as one "
                f"micro-batch ({context}), where per_device_train_batch_size is {asked}"
            )
        return batches, samples / own if self.reduction == "mean" else 1.0

    def refusal(self, change: str) -> LossReductionError:
        """The error for a ``change`` of the user's batch that no weight keeps the step through."""
        return LossReductionError(
            f"{change}, and cannot keep the optimizer step so: {self.finding}, so no weight of each "
            f"micro-batch's loss gives the step of the batches asked. Make the loss a sum divided by "
            f"num_items_in_batch (a model whose forward takes it, or compute_loss_func), a sum, or a mean "
            f"over examples with one label each; or train with the plain Trainer at sizes that fit."
        )


def read_reduction(trainer: Any, batch: Any) -> tuple[TrainerReduction | None, str]:
    """How the Trainer's loss (its ``compute_loss``: the model's, ``compute_loss_func``'s, a
    subclass's) adds up over the first two samples of ``batch``, and what was seen: their loss
    together, then each alone with the same ``num_items_in_batch``; the model in eval mode (no
    dropout), no gradients, the random state put back."""
    model = trainer.model
    pair = micro_batch(batch, 0, 2, 0)
    _, num_items_in_batch = trainer.get_batch_samples(iter([pair]), 1, trainer.args.device)
    training, rng = model.training, RngState.capture()
    model.eval()
    try:
        with torch.no_grad():
            together, first, second = (
                _loss(trainer, part, num_items_in_batch)
                for part in (pair, micro_batch(pair, 0, 1, 0), micro_batch(pair, 1, 1, 0))
            )
    finally:
        model.train(training)
        rng.restore()
    seen = (
        f"the Trainer's loss of two training examples is {together:.6g}, and of each alone (with the same "
        f"num_items_in_batch) {first:.6g} and {second:.6g}"
    )
    total = first + second
    if _close(together, total) and not _close(together, total / 2):
        return "additive", f"{seen}: their sum"
    labels = pair.get("labels") if isinstance(pair, dict) else None
    one_label_each = isinstance(labels, torch.Tensor) and labels.numel() == 2
    if _close(together, total / 2) and not _close(together, total) and one_label_each:
        return "mean", f"{seen}: their mean"
    if _close(together, total / 2) and not one_label_each:
        return None, f"{seen}: their mean, over examples without exactly one label each (a mean over tokens?)"
    return None, f"{seen}: neither their sum nor their mean"


@contextlib.contextmanager
def weighted_loss(trainer: Any, weight: float) -> Iterator[None]:
    """``trainer.compute_loss`` times ``weight`` for the block (this instance's, whatever class
    defines it), so that the Trainer's step backpropagates and returns the weighted loss."""
    if weight == 1.0:
        yield
        return
    own = trainer.__dict__.get("compute_loss")
    compute_loss = trainer.compute_loss

    def weighted(*args: Any, **kwargs: Any) -> Any:
        result = compute_loss(*args, **kwargs)
        if isinstance(result, tuple):  # (loss, outputs), for return_outputs=True
            return (result[0] * weight, *result[1:])
        return result * weight

    trainer.compute_loss = weighted
    try:
        yield
    finally:
        if own is None:
            del trainer.compute_loss
        else:
            trainer.compute_loss = own


def _loss(trainer: Any, batch: Any, num_items_in_batch: Any) -> float:
    inputs = trainer._prepare_inputs(batch)
    with trainer.compute_loss_context_manager():
        loss = trainer.compute_loss(trainer.model, inputs, num_items_in_batch=num_items_in_batch)
    return float(loss.detach().double().mean())


def _close(value: float, target: float) -> bool:
    return math.isfinite(value) and abs(value - target) <= TOLERANCE * max(abs(target), 1e-12)

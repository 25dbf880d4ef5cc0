"""How ``MicroBatchStep`` weights each micro-batch's loss so that the accumulated gradient is the full
batch's: the loss's reduction (mean over samples, sum, or mean over the target's non-ignored
tokens), declared or read from a loss module, and the weights it gives a split of a batch."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from batchfit.errors import ConfigurationError
from batchfit.runtime.steps.micro_batches import plain

#: What one micro-batch's loss is: its mean over its samples, its sum over them, or its mean over
#: the elements of its target that are not ``ignore_index`` (cross-entropy over padded sequences).
Reduction = Literal["mean", "sum", "token_mean"]
REDUCTIONS: tuple[Reduction, ...] = ("mean", "sum", "token_mean")
#: The target value torch's cross-entropy and NLL losses skip by default.
DEFAULT_IGNORE_INDEX = -100


@dataclass(frozen=True)
class LossReduction:
    """The reduction a ``MicroBatchStep`` honours, and where it comes from."""

    reduction: Reduction
    ignore_index: int  # token_mean: the target value that is not counted
    source: str  # "declared", "the default", or the loss module read: "CrossEntropyLoss(reduction='sum')"

    def weights(self, batch: Any, samples: int, batch_dim: int) -> Callable[[list[int]], list[float]]:
        """For ``batch``, the weight of each micro-batch's loss given the split ``sizes``: its loss
        times its weight, summed over the micro-batches, is the full batch's loss."""
        if self.reduction == "mean":
            return lambda sizes: [size / samples for size in sizes]
        if self.reduction == "sum":
            return lambda sizes: [1.0] * len(sizes)
        tokens = token_counts(target_of(batch), self.ignore_index, samples, batch_dim)
        total = sum(tokens)

        def token_weights(sizes: list[int]) -> list[float]:
            starts = [sum(sizes[:index]) for index in range(len(sizes))]
            counts = [sum(tokens[start : start + size]) for start, size in zip(starts, sizes, strict=True)]
            return [count / total if total else float("nan") for count in counts]

        return token_weights


def resolve_reduction(reduction: Any, ignore_index: Any, loss_fn: Any) -> LossReduction:
    """The reduction declared (``reduction``, ``ignore_index``) checked against the one ``loss_fn``
    holds when it is a torch loss module; else the one declared; else the mean."""
    if reduction is not None and reduction not in REDUCTIONS:
        raise ConfigurationError(
            f"reduction ({reduction!r}) must be 'mean' (the loss is a mean over the micro-batch's "
            f"samples), 'sum' (a sum over them), 'token_mean' (a mean over the target's elements that are "
            f"not ignore_index) or None (read it from a loss module, else 'mean')."
        )
    if ignore_index is not None and (isinstance(ignore_index, bool) or not isinstance(ignore_index, int)):
        raise ConfigurationError(
            f"ignore_index must be an int, got {type(ignore_index).__name__} ({ignore_index!r}); pass the "
            f"target value the loss skips (-100 for torch's cross_entropy), or None."
        )
    read = _read_module(loss_fn) if isinstance(loss_fn, nn.Module) else None
    if read is None:
        chosen: Reduction = reduction or "mean"
        if ignore_index is not None and chosen != "token_mean":
            raise ConfigurationError(
                f"ignore_index ({ignore_index}) counts only with reduction='token_mean', not {chosen!r}; "
                f"pass reduction='token_mean' if the loss is a mean over the non-ignored target elements."
            )
        index = DEFAULT_IGNORE_INDEX if ignore_index is None else ignore_index
        return LossReduction(chosen, index, "the default" if reduction is None else "declared")
    return _agree(read, reduction, ignore_index)


def _read_module(loss_fn: nn.Module) -> LossReduction | None:
    """The reduction of a torch loss module (``nn.CrossEntropyLoss(reduction='sum')``), or None
    where the module says none; raises where it is one that micro-batches cannot add up."""
    module_reduction = getattr(loss_fn, "reduction", None)
    if not isinstance(module_reduction, str):
        return None
    index = getattr(loss_fn, "ignore_index", None)
    described = f"{type(loss_fn).__name__}(reduction={module_reduction!r})"
    if module_reduction == "none":
        raise ConfigurationError(
            f"loss_fn is {described}: it returns one loss per element, and MicroBatchStep backpropagates "
            f"a scalar; pass reduction='mean' or 'sum' to the loss module."
        )
    if module_reduction not in ("mean", "batchmean", "sum"):
        raise ConfigurationError(
            f"loss_fn is {described}, a reduction MicroBatchStep cannot add up over micro-batches; use "
            f"'mean' or 'sum', or pass compute_loss with reduction='mean', 'sum' or 'token_mean'."
        )
    if module_reduction != "sum" and getattr(loss_fn, "weight", None) is not None and index is not None:
        raise ConfigurationError(
            f"loss_fn is {described} with class weights: its mean divides by the sum of the weights of "
            f"the batch's targets, which no split of the batch into micro-batches keeps. Use "
            f"reduction='sum' and divide by that sum yourself in compute_loss, or drop weight."
        )
    if module_reduction == "sum":
        return LossReduction("sum", DEFAULT_IGNORE_INDEX, described)
    if isinstance(index, int):
        return LossReduction("token_mean", index, f"{described[:-1]}, ignore_index={index})")
    return LossReduction("mean", DEFAULT_IGNORE_INDEX, described)


def _agree(read: LossReduction, reduction: Reduction | None, ignore_index: int | None) -> LossReduction:
    """``read`` where what is declared agrees with it (a declared 'mean' is the module's token mean
    when it skips a target value: both are the mean where no target is skipped)."""
    declared = reduction or read.reduction
    if "sum" in (declared, read.reduction) and declared != read.reduction:
        raise ConfigurationError(
            f"reduction={reduction!r} disagrees with loss_fn, {read.source}; the loss module's reduction "
            f"is what its loss is: drop reduction, or change the module's."
        )
    if declared == "token_mean" and read.reduction == "mean":
        raise ConfigurationError(
            f"reduction='token_mean' needs a loss that skips a target value, and loss_fn, {read.source}, "
            f"has no ignore_index; drop reduction, or pass a loss that has one."
        )
    if ignore_index is not None and ignore_index != read.ignore_index:
        raise ConfigurationError(
            f"ignore_index={ignore_index} disagrees with loss_fn, {read.source}; drop ignore_index, or "
            f"set it on the loss module."
        )
    return read


def target_of(batch: Any) -> torch.Tensor:
    """The target whose elements a token mean counts: the second of a pair ``(inputs, target)``,
    else a mapping's ``"labels"``."""
    batch = plain(batch)
    if isinstance(batch, Sequence) and len(batch) == 2 and isinstance(batch[1], torch.Tensor):
        return batch[1]
    labels = batch.get("labels") if isinstance(batch, Mapping) else None
    if isinstance(labels, torch.Tensor):
        return labels
    raise ConfigurationError(
        f"reduction='token_mean' counts the target's elements that are not ignore_index, but the batch "
        f"({type(batch).__name__}) is neither a pair (inputs, target) nor a mapping with a 'labels' "
        f"tensor; put the target there, or divide the loss's sum by the batch's token count yourself in "
        f"compute_loss and pass reduction='sum'."
    )


def token_counts(target: torch.Tensor, ignore_index: int, samples: int, batch_dim: int) -> list[int]:
    """Per sample, the elements of ``target`` that are not ``ignore_index`` (read in one transfer).
    A floating-point target (class probabilities) skips nothing: each sample counts one."""
    if target.is_floating_point():
        return [1] * samples
    kept = (target != ignore_index).movedim(batch_dim, 0).reshape(samples, -1).sum(dim=1)
    return [int(count) for count in kept.tolist()]

"""Cutting a batch (a pytree: tuples, lists, dicts of tensors) into micro-batches along ``batch_dim``,
as views: no sample is copied, lost or repeated; and ``plain``, which makes any batch such a pytree."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from batchfit.errors import ConfigurationError


def plain(batch: Any) -> Any:
    """``batch`` with every mapping that is not a dict (Hugging Face's ``BatchEncoding``, what its
    tokenizers and data collators return; a ``UserDict``) made a dict, through tuples, lists and
    dicts: torch's pytree, which batchfit walks to copy, count and cut a batch, takes such a
    mapping for a single leaf and would find no tensor in it. A batch without one is returned as
    it is, the same object."""
    if isinstance(batch, Mapping):
        items = {key: plain(value) for key, value in batch.items()}
        if isinstance(batch, dict) and all(items[key] is batch[key] for key in batch):
            return batch
        return items
    if isinstance(batch, (list, tuple)) and not hasattr(batch, "_fields"):  # a namedtuple is kept
        values = [plain(value) for value in batch]
        if all(new is old for new, old in zip(values, batch, strict=True)):
            return batch
        return values if isinstance(batch, list) else tuple(values)
    return batch


def count_samples(batch: Any, batch_dim: int) -> int:
    """The samples of ``batch``: the size of its tensors along ``batch_dim``, which they must share."""
    tensors = [leaf for leaf in tree_flatten(plain(batch))[0] if isinstance(leaf, torch.Tensor)]
    if not tensors:
        raise ConfigurationError(
            f"the batch ({type(batch).__name__}) holds no tensors; MicroBatchStep splits a batch's tensors "
            f"along batch_dim, so pass tensors in tuples, lists or dicts."
        )
    for tensor in tensors:
        if tensor.dim() <= batch_dim:
            raise ConfigurationError(
                f"a tensor of the batch has shape {tuple(tensor.shape)}, with no dimension "
                f"batch_dim={batch_dim}; every tensor of the batch must have its samples along batch_dim "
                f"(a value shared by all samples goes in a non-tensor leaf, such as a float)."
            )
    sizes = {tensor.shape[batch_dim] for tensor in tensors}
    if len(sizes) > 1:
        shapes = ", ".join(str(tuple(tensor.shape)) for tensor in tensors)
        raise ConfigurationError(
            f"the batch's tensors hold different numbers of samples along batch_dim={batch_dim} "
            f"(shapes {shapes}); each tensor must have the same size there, so every micro-batch gets "
            f"matching slices."
        )
    samples = int(sizes.pop())
    if samples == 0:
        raise ConfigurationError(
            f"the batch holds no samples (size 0 along batch_dim={batch_dim}); skip empty batches."
        )
    return samples


def micro_batch(batch: Any, start: int, size: int, batch_dim: int) -> Any:
    """Samples ``start`` to ``start + size`` of ``batch``: each tensor narrowed along ``batch_dim`` (a
    view), every other leaf (a flag, a string) as it is."""
    leaves, spec = tree_flatten(plain(batch))
    return tree_unflatten(
        [leaf.narrow(batch_dim, start, size) if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves],
        spec,
    )

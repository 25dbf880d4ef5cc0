"""Cutting a batch (a pytree: tuples, lists, dicts of tensors) into micro-batches along ``batch_dim``,
as views: no sample is copied, lost or repeated."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from batchfit.errors import ConfigurationError


def count_samples(batch: Any, batch_dim: int) -> int:
    """The samples of ``batch``: the size of its tensors along ``batch_dim``, which they must share."""
    tensors = [leaf for leaf in tree_flatten(batch)[0] if isinstance(leaf, torch.Tensor)]
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
    leaves, spec = tree_flatten(batch)
    return tree_unflatten(
        [leaf.narrow(batch_dim, start, size) if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves],
        spec,
    )

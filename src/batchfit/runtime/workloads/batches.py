"""Batches as a data loader hands them to training: a dataset's largest items first, collated and
checked for size on the host, then copied to the device for each step."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._pytree import tree_leaves, tree_map

from batchfit.errors import ConfigurationError
from batchfit.runtime.steps.micro_batches import plain

#: Items scanned to find the largest samples of a dataset; larger datasets are sampled.
MAX_SCANNED_ITEMS = 10_000


def largest_first(dataset: Any, size_key: Callable[[Any], float] | None) -> list[int]:
    """The indices of ``dataset``'s items, largest first (by ``size_key(item)``, default:
    ``item_size``); of a sample of ``MAX_SCANNED_ITEMS`` where it holds more."""
    length = len(dataset)
    if length == 0:
        raise ConfigurationError("Workload.dataset is empty; it needs at least one item.")
    indices = list(range(length))
    if length > MAX_SCANNED_ITEMS:  # a private RNG: the user's random state is untouched
        indices = random.Random(0).sample(indices, MAX_SCANNED_ITEMS)
    key = size_key or item_size
    return sorted(indices, key=lambda index: -key(dataset[index]))


def collated(
    dataset: Any, order: list[int], batch_size: int, collate_fn: Callable[[list[Any]], Any] | None
) -> Any:
    """A batch of ``batch_size`` items of ``dataset`` taken in ``order`` (from its start again where
    it holds fewer), collated by ``collate_fn`` or torch's ``default_collate``."""
    items = [dataset[order[i % len(order)]] for i in range(batch_size)]
    if collate_fn is not None:
        return collate_fn(items)  # the user's own: its errors are theirs, unchanged
    try:
        return torch.utils.data.default_collate(items)
    except (RuntimeError, TypeError, ValueError) as error:
        raise ConfigurationError(
            f"torch's default_collate could not make a batch of {batch_size} dataset "
            f"items ({error}); items of different sizes (token lists of varying length) "
            f"need a collate_fn that pads them: pass Workload(collate_fn=...), the one "
            f"your training DataLoader uses."
        ) from error


def check_batch_size(batch: Any, batch_size: int, batch_dim: int, source: str) -> None:
    """A ConfigurationError naming ``source`` where ``batch`` holds no tensor, or its first tensor
    does not hold ``batch_size`` samples along ``batch_dim``."""
    leaves = tree_leaves(batch)
    tensors = [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]
    if not tensors:
        arrays = [type(leaf).__name__ for leaf in leaves if hasattr(leaf, "__array__")]
        held = f" ({arrays[0]}: convert it with torch.from_numpy or torch.as_tensor)" if arrays else ""
        raise ConfigurationError(f"{source} returned no tensors{held}; a batch must hold tensors.")
    first = tensors[0]
    found = first.shape[batch_dim] if first.dim() > batch_dim else None
    if found != batch_size:
        raise ConfigurationError(
            f"{source} returned a batch of {found} samples (its first tensor has shape "
            f"{tuple(first.shape)}, batch_dim={batch_dim}), not {batch_size}; "
            f"make_batch(n) must return exactly n samples along batch_dim."
        )


def on_host(batch: Any) -> Any:
    """``batch`` with its CUDA tensors moved to the host (the rest as they are)."""
    return tree_map(
        lambda leaf: leaf.cpu() if isinstance(leaf, torch.Tensor) and leaf.device.type == "cuda" else leaf,
        batch,
    )


def to_device(batch: Any, device: torch.device, *, non_blocking: bool = False) -> Any:
    """Copy every tensor of ``batch`` to ``device`` as training does: a new, compact copy
    (``non_blocking`` from pinned host memory, as a loader with pin_memory=True allows)."""
    return tree_map(
        lambda leaf: (
            leaf.to(device, copy=True, non_blocking=non_blocking) if isinstance(leaf, torch.Tensor) else leaf
        ),
        plain(batch),
    )


def item_size(item: Any) -> float:
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

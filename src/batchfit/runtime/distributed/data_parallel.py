"""A model wrapped in ``DistributedDataParallel``: the module its steps run in a trial, and the
gradient buckets DDP's reducer holds on the device beside it.

A trial runs the wrapper's own module: DDP's forward and backward hold collectives (buffers
broadcast, gradients all-reduced), and a rank that ran out of memory inside one would leave the
others waiting in it. What DDP adds to training's memory is counted instead: at construction its
reducer allocates flat buckets for the gradients of the parameters it reduces, held for the
wrapper's life, into which each backward copies the gradients to all-reduce them.
"""

from __future__ import annotations

import contextlib
import logging
import weakref
from collections.abc import Collection, Iterator
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

from batchfit.runtime.distributed.sharded import is_fully_sharded
from batchfit.units import format_bytes

logger = logging.getLogger(__name__)
#: The models told already that they were searched unwrapped on several ranks (once is enough).
_TOLD: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()


def unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    """The module a trial runs: a ``DistributedDataParallel``'s own module, else ``model``."""
    return model.module if isinstance(model, DistributedDataParallel) else model


class DataParallelStandIn(torch.nn.Module):
    """What the user's ``train_step`` and ``eval_step`` are given in a trial in place of a
    ``DistributedDataParallel``: its module, under DDP's own interface (``.module``,
    ``no_sync()``, the ``module.`` prefix of its names), with no collective. A trial reduces no
    gradients, so ``no_sync`` (a step that accumulates over micro-batches) holds nothing back."""

    def __init__(self, module: torch.nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        yield


def bucket_bytes(model: torch.nn.Module) -> int:
    """Bytes of the gradient buckets that ``model``'s reducer allocated, 0 unless it is a
    ``DistributedDataParallel`` (``reduced_bytes`` of its module, less what it ignores).

    With ``gradient_as_bucket_view=True`` the buckets are the gradients themselves, which a trial
    allocates too: the count then errs high by at most the gradients' bytes."""
    if not isinstance(model, DistributedDataParallel):
        return 0
    return reduced_bytes(model.module, model.parameters_to_ignore)


def reduced_bytes(module: torch.nn.Module, ignored: Collection[str] = ()) -> int:
    """A gradient's bytes for each parameter of ``module`` that DDP reduces in a bucket
    (``reduced_parameters``, less those with a sparse gradient)."""
    reduced = reduced_parameters(module, ignored)
    return sum(parameter.numel() * parameter.element_size() for parameter, sparse in reduced if not sparse)


def reduced_parameters(
    module: torch.nn.Module, ignored: Collection[str] = ()
) -> list[tuple[torch.nn.Parameter, bool]]:
    """Each parameter of ``module`` that DDP reduces, in the order it registers them, as DDP
    chooses them: requiring a gradient, not named in ``ignored`` (DDP's own keys, from
    ``_ddp_params_and_buffers_to_ignore``), each shared one once; and whether its gradient is
    sparse (an ``nn.Embedding(sparse=True)``'s, reduced as it is, in no bucket)."""
    seen: set[int] = set()
    reduced = []
    for module_name, child in module.named_modules():
        sparse = isinstance(child, (torch.nn.Embedding, torch.nn.EmbeddingBag)) and child.sparse
        for name, parameter in child.named_parameters(recurse=False):
            # DDP's key for a parameter: a root parameter's name starts with a dot.
            if not parameter.requires_grad or f"{module_name}.{name}" in ignored or id(parameter) in seen:
                continue
            seen.add(id(parameter))
            reduced.append((parameter, bool(sparse)))
    return reduced


def note_unwrapped(model: torch.nn.Module, world_size: int) -> None:
    """Warn, once per model, that ranks search a plain model: training that wraps it in DDP holds
    DDP's buckets beside it, which such a search does not count (pass the wrapped model)."""
    if isinstance(model, DistributedDataParallel) or model in _TOLD or is_fully_sharded(model):
        return
    _TOLD.add(model)
    logger.warning(
        "%d ranks search a model that is not wrapped in DistributedDataParallel; if training wraps "
        "it, pass the wrapped model (Workload(model=DistributedDataParallel(model), ...)): DDP holds "
        "gradient buckets of %s beside it, which this search does not count.",
        world_size,
        format_bytes(reduced_bytes(model)),
    )

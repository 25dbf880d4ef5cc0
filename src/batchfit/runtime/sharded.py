"""A model sharded by FSDP, an optimizer sharded by ZeRO: what a trial runs of them.

FSDP2's ``fully_shard`` swaps a module's parameters for their gathered copies before its forward
and back after; a step that raises in between leaves the gathered copies registered and FSDP's
state saying so, and the next forward would run on the shards as if they were whole: ``reshard``
puts it back. ``ZeroRedundancyOptimizer`` steps this rank's shard, then broadcasts every shard
from its rank; a rank that ran out of memory in its shard's step would leave the others waiting
in that broadcast, so a trial steps the shard alone (``local_step``), as DDP's module runs alone.
"""

from __future__ import annotations

import logging
import sys
import weakref
from typing import Any

import torch

logger = logging.getLogger(__name__)
#: The FSDP roots warned already that this torch cannot reset them (once is enough).
_TOLD: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()


def _imported(module: str, name: str) -> type | None:
    """``module.name`` where ``module`` was imported (no model is sharded before it is), else None."""
    kind = getattr(sys.modules.get(module), name, None)
    return kind if isinstance(kind, type) else None


def is_fully_sharded(model: torch.nn.Module) -> bool:
    """Whether any of ``model``'s modules is sharded by FSDP (FSDP1's wrapper, FSDP2's ``fully_shard``)."""
    names = ("FullyShardedDataParallel", "FSDPModule")
    kinds = tuple(kind for kind in (_imported("torch.distributed.fsdp", name) for name in names) if kind)
    return bool(kinds) and any(isinstance(module, kinds) for module in model.modules())


def reshard(model: torch.nn.Module) -> None:
    """Put the FSDP2 modules of ``model`` back as a step that completed leaves them: after a step
    that raised midway, each root's ``reset_iter_state`` waits on its collectives in flight,
    registers the shards again and clears the iteration's bookkeeping. A root that has not run
    yet has nothing to reset. A torch without ``reset_iter_state`` gets each module's ``reshard``,
    which registers the shards but leaves the bookkeeping, and a warning, once per root."""
    kind = _imported("torch.distributed.fsdp", "FSDPModule")
    if kind is None:
        return
    roots: list[str] = []
    for name, module in model.named_modules():
        if not isinstance(module, kind) or any(_inside(name, root) for root in roots):
            continue
        roots.append(name)
        sharded: Any = module
        if not hasattr(sharded, "reset_iter_state"):
            if sharded not in _TOLD:
                _TOLD.add(sharded)
                logger.warning(
                    "torch %s has no FSDPModule.reset_iter_state: after a trial that runs out of "
                    "memory inside FSDP's forward or backward, the next trial may fail (torch 2.13 "
                    "has it).",
                    torch.__version__,
                )
            shards: list[Any] = [each for each in sharded.modules() if isinstance(each, kind)]
            for each in shards:
                each.reshard()
        elif sharded._get_fsdp_state()._is_root is not None:  # set by its first forward
            sharded.reset_iter_state()


def _inside(name: str, root: str) -> bool:
    return root == "" or name.startswith(f"{root}.")


def local_step(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """The optimizer a trial steps: for a ``ZeroRedundancyOptimizer``, a view of it (the same
    parameter groups, state and local optimizer) whose ``step`` updates this rank's shard and
    broadcasts nothing (ZeRO's own ``_local_step``); the broadcast writes into the parameters in
    place, so the step's memory is the same. Any other optimizer is returned as it is."""
    kind = _imported("torch.distributed.optim", "ZeroRedundancyOptimizer")
    if kind is None or not isinstance(optimizer, kind):
        return optimizer
    zero: Any = optimizer
    if zero._overlap_with_ddp:  # DDP's comm hook steps it, and a trial runs no DDP hook
        return optimizer
    view = object.__new__(type(optimizer))
    view.__dict__.update(zero.__dict__)

    def step(closure: Any = None, **kwargs: Any) -> Any:
        return zero._local_step(closure=closure, **kwargs)

    view.__dict__["step"] = step
    return view

"""A model sharded by FSDP: how to recognise one, and how to put it back in its sharded state
after a step that stopped midway (an out-of-memory inside a trial).

FSDP2's ``fully_shard`` swaps a module's parameters for their gathered copies before its forward
and back after; a step that raises in between leaves the gathered copies registered and FSDP's
state saying so, and the next forward would run on the shards as if they were whole.
"""

from __future__ import annotations

import sys
from typing import Any

import torch


def _fsdp_kinds() -> tuple[type, ...]:
    fsdp = sys.modules.get("torch.distributed.fsdp")  # no model is sharded before FSDP is imported
    names = ("FullyShardedDataParallel", "FSDPModule")
    return tuple(kind for kind in (getattr(fsdp, name, None) for name in names) if isinstance(kind, type))


def is_fully_sharded(model: torch.nn.Module) -> bool:
    """Whether any of ``model``'s modules is sharded by FSDP (FSDP1's wrapper, FSDP2's ``fully_shard``)."""
    kinds = _fsdp_kinds()
    return bool(kinds) and any(isinstance(module, kinds) for module in model.modules())


def reshard(model: torch.nn.Module) -> None:
    """Put the FSDP2 modules of ``model`` back as a step that completed leaves them: after a step
    that raised midway, each root's ``reset_iter_state`` waits on its collectives in flight,
    registers the shards again and clears the iteration's bookkeeping. A root that has not run
    yet has nothing to reset; a torch without ``reset_iter_state`` (before 2.13) gets each
    module's ``reshard``, which registers the shards but leaves the bookkeeping."""
    kind: Any = getattr(sys.modules.get("torch.distributed.fsdp"), "FSDPModule", None)
    if not isinstance(kind, type):
        return
    roots: list[str] = []
    for name, module in model.named_modules():
        if not isinstance(module, kind) or any(_inside(name, root) for root in roots):
            continue
        roots.append(name)
        sharded: Any = module
        if not hasattr(sharded, "reset_iter_state"):
            shards: list[Any] = [each for each in sharded.modules() if isinstance(each, kind)]
            for each in shards:
                each.reshard()
        elif sharded._get_fsdp_state()._is_root is not None:  # set by its first forward
            sharded.reset_iter_state()


def _inside(name: str, root: str) -> bool:
    return root == "" or name.startswith(f"{root}.")

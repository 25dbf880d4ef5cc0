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


def _fully_shard_module() -> type | None:
    """FSDP2's module class: public from torch 2.6, in ``_composable`` before (2.4-2.5)."""
    return _imported("torch.distributed.fsdp", "FSDPModule") or _imported(
        "torch.distributed._composable.fsdp", "FSDPModule"
    )


def is_fully_sharded(model: torch.nn.Module) -> bool:
    """Whether any of ``model``'s modules is sharded by FSDP (FSDP1's wrapper, FSDP2's ``fully_shard``)."""
    found = (_imported("torch.distributed.fsdp", "FullyShardedDataParallel"), _fully_shard_module())
    kinds = tuple(kind for kind in found if kind)
    return bool(kinds) and any(isinstance(module, kinds) for module in model.modules())


def reshard(model: torch.nn.Module) -> None:
    """Put the FSDP2 modules of ``model`` back as a step that completed leaves them: after a step
    that raised midway, each root's ``reset_iter_state`` waits on its collectives in flight,
    registers the shards again and clears the iteration's bookkeeping. A root that has not run
    yet has nothing to reset. A torch from before ``reset_iter_state`` (2.13) gets the same reset
    done on the state it keeps (``_reset_by_hand``); where that state is not as expected, each
    module's ``reshard``, which registers the shards but leaves the bookkeeping, and a warning,
    once per root."""
    kind = _fully_shard_module()
    if kind is None:
        return
    roots: list[str] = []
    for name, module in model.named_modules():
        if not isinstance(module, kind) or any(_inside(name, root) for root in roots):
            continue
        roots.append(name)
        sharded: Any = module
        state = sharded._get_fsdp_state()
        if state._is_root is None:  # set by its first forward: nothing ran, nothing to reset
            continue
        if hasattr(sharded, "reset_iter_state"):
            sharded.reset_iter_state()
        elif not _reset_by_hand(state):
            if sharded not in _TOLD:
                _TOLD.add(sharded)
                logger.warning(
                    "torch %s keeps FSDP's iteration state where batchfit does not expect it: "
                    "after a trial that runs out of memory inside FSDP's forward or backward, the "
                    "next trial may fail (torch 2.13 resets it itself: reset_iter_state).",
                    torch.__version__,
                )
            shards: list[Any] = [each for each in sharded.modules() if isinstance(each, kind)]
            for each in shards:
                each.reshard()


#: What ``_reset_by_hand`` reads of an FSDP2 root's state and of each parameter group's (torch
#: 2.6-2.12 keep them under these names); any one missing, it leaves the state untouched.
_ROOT_STATE = ("_comm_ctx", "_state_ctx", "_device_handle")
_GROUP_STATE = (
    "_all_gather_result",
    "_post_reduce_event",
    "_all_reduce_state",
    "_reshard_after_forward_event",
    "_wait_all_gather_streams_on_event",
    "_partial_reduce_output",
    "_post_forward_indices",
    "_training_state",
    "_to_sharded",
)


def _reset_by_hand(root: Any) -> bool:
    """What FSDP2's ``reset_iter_state`` does (torch 2.13), for a torch from before it: wait on
    the collectives in flight, forget the reductions and all-gathers, set every state and
    parameter group idle, register the shards again, and clear the iteration's trackers, so the
    next forward starts a new iteration at the root. False, and nothing changed, where this torch
    keeps that state otherwise."""
    states = list(getattr(getattr(root, "_state_ctx", None), "all_states", ()))
    groups = [group for state in states for group in _param_groups(state)]
    if (
        not states
        or not all(hasattr(root, name) for name in _ROOT_STATE)
        or not all(hasattr(state, "_modules_to_run_forward") for state in states)
        or not all(hasattr(group, name) for group in groups for name in _GROUP_STATE)
    ):
        return False
    stream = root._device_handle.current_stream()
    comm, context = root._comm_ctx, root._state_ctx
    # torch 2.11 keeps one reduce-scatter in flight, 2.13 a list of them
    pending = [getattr(comm, "all_gather_state", None), getattr(comm, "reduce_scatter_state", None)]
    pending += list(getattr(comm, "reduce_scatter_states", ()))
    for each in pending:
        event = getattr(each, "event", None)
        if event is not None:
            stream.wait_event(event)
    for name in ("all_gather_state", "reduce_scatter_state"):
        if hasattr(comm, name):
            setattr(comm, name, None)
    for name in ("reduce_scatter_states", "post_forward_order"):
        if hasattr(comm, name):
            getattr(comm, name).clear()
    for group in groups:
        _reset_group(group, stream)
    for state in states:
        state._modules_to_run_forward.clear()
        state._training_state = type(state._training_state).IDLE
    context.iter_forward_root = None
    context.post_backward_final_callback_queued = False
    return True


def _param_groups(state: Any) -> list[Any]:
    """A state's FSDP parameter groups: one or none (torch 2.11), or a list (2.13)."""
    if hasattr(state, "_fsdp_param_groups"):
        return list(state._fsdp_param_groups)
    group = getattr(state, "_fsdp_param_group", None)
    return [group] if group is not None else []


def _reset_group(group: Any, stream: Any) -> None:
    gathered = group._all_gather_result
    if gathered is not None:
        if getattr(gathered, "all_gather_event", None) is not None:
            stream.wait_event(gathered.all_gather_event)
        work = getattr(gathered, "all_gather_work", None)
        if work is not None and hasattr(work, "wait"):
            work.wait()
        group._all_gather_result = None
    if group._post_reduce_event is not None:
        stream.wait_event(group._post_reduce_event)
        group._post_reduce_event = None
    if getattr(group._all_reduce_state, "event", None) is not None:
        stream.wait_event(group._all_reduce_state.event)
    group._all_reduce_state = None
    if group._reshard_after_forward_event is not None:
        group._wait_all_gather_streams_on_event(group._reshard_after_forward_event)
        group._reshard_after_forward_event = None
    group._partial_reduce_output = None
    group._post_forward_indices.clear()
    group._training_state = type(group._training_state).IDLE
    group._to_sharded()


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

"""The gradient buckets of a ``DistributedDataParallel`` as its reducer lays them out, and the one
time it lays them out again: what a training trial holds for them, bucket by bucket.

A reducer built without ``find_unused_parameters`` (or with ``static_graph``) puts every parameter
in one flat bucket, then, at the start of the forward after its first backward (training's second
step), frees it and allocates buckets of at most ``bucket_cap_mb`` in the order the gradients came
(``Reducer::rebuild_buckets``). The new buckets take whatever blocks a caching allocator holds free
at that point, with the step's batch resident: the fragmentation training lives with from then on.
Behind a caching allocator a trial holds tensors of the buckets' sizes and rebuilds them there too.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from torch._C._distributed_c10d import _DEFAULT_FIRST_BUCKET_BYTES, _compute_bucket_assignment_by_size
from torch.nn.parallel import DistributedDataParallel
from torch.utils.hooks import RemovableHandle

from batchfit.runtime.devices.device import BucketHolding, Device
from batchfit.runtime.devices.measurement import Measurement
from batchfit.runtime.distributed.data_parallel import reduced_parameters

#: The training step in whose first forward DDP rebuilds its buckets.
REBUILD_STEP = 2


@dataclass(frozen=True)
class BucketLayout:
    """The bytes of each gradient bucket a DDP's reducer holds before its rebuild (``held``), and
    of each bucket it rebuilds them into (``rebuilt``); both empty where it rebuilds none (not a
    DDP, one that finds unused parameters, or one that has rebuilt already)."""

    held: tuple[int, ...] = ()
    rebuilt: tuple[int, ...] = ()

    @property
    def rebuilds(self) -> bool:
        return bool(self.rebuilt)


def bucket_layout(model: torch.nn.Module) -> BucketLayout:
    """The layout of ``model``'s buckets where it is a ``DistributedDataParallel`` that rebuilds
    them, by DDP's rules: the parameters it reduces grouped by dtype (a sparse gradient in no
    bucket), one bucket for all at first, then buckets of at most ``bucket_cap_mb`` (the first of
    1 MiB) in the reverse of the order the module registers the parameters. That is the order DDP
    assumes before it sees a backward, and the order a model whose layers run as they are defined
    produces gradients in; DDP rebuilds in the order it saw, which may group them otherwise."""
    if not isinstance(model, DistributedDataParallel):
        return BucketLayout()
    reduced = reduced_parameters(model.module, model.parameters_to_ignore)
    parameters: list[torch.Tensor] = [parameter for parameter, _ in reduced]
    sparse = [is_sparse for _, is_sparse in reduced]
    if not parameters:
        return BucketLayout()
    rebuilds = (model.static_graph or not model.find_unused_parameters) and not getattr(
        model, "_has_rebuilt_buckets", False
    )
    if not rebuilds:
        return BucketLayout()
    config = getattr(model, "_bucket_config", None)
    first = getattr(config, "first_bucket_bytes_cap", _DEFAULT_FIRST_BUCKET_BYTES)
    limits = list(getattr(config, "per_bucket_bytes_caps", ())) or [first, model.bucket_bytes_cap]
    return BucketLayout(
        held=_sizes(parameters, sparse, [sys.maxsize]), rebuilt=_sizes(parameters[::-1], sparse[::-1], limits)
    )


def reproduced(layout: BucketLayout, holding: BucketHolding, mode: str) -> tuple[int, ...]:
    """The buckets a search's trials rebuild DDP's into (``layout.rebuilt``): its training trials,
    behind a caching allocator (``holding`` not "counted"); empty where they rebuild none."""
    return layout.rebuilt if mode == "train" and holding != "counted" else ()


def opening_steps(steps: int, layout: BucketLayout, holding: BucketHolding, mode: str) -> int:
    """The steps of a search's opening trials, ``steps`` (``Trials.steps_per_trial``), or one past
    the rebuild where they reproduce it (``reproduced``): the last step a trial records is the
    steady state that the replay of its requests plays again."""
    return max(steps, REBUILD_STEP + 1) if reproduced(layout, holding, mode) else steps


def _sizes(parameters: list[torch.Tensor], sparse: list[bool], limits: list[int]) -> tuple[int, ...]:
    """The bytes of each dense bucket DDP assigns ``parameters`` to under ``limits``, in its order."""
    buckets, _ = _compute_bucket_assignment_by_size(parameters, limits, sparse)
    return tuple(
        sum(parameters[index].numel() * parameters[index].element_size() for index in bucket)
        for bucket in buckets
        if not any(sparse[index] for index in bucket)
    )


@dataclass
class TrialBuckets:
    """A training trial's stand-in for DDP's buckets on ``device``, held as the device holds them
    (``holding``, a ``BucketHolding``): from ``start``, the ``held`` ones where they are "placed",
    and from the first forward with gradients of step ``REBUILD_STEP`` (read from ``measurement``)
    the ``rebuilt`` ones, the held ones freed first, as the reducer frees its bucket first."""

    layout: BucketLayout
    module: torch.nn.Module
    device: torch.device
    holding: BucketHolding
    measurement: Measurement
    tensors: list[torch.Tensor] = field(default_factory=list)
    rebuilt: bool = False
    _hook: RemovableHandle | None = None

    def start(self) -> None:
        """Allocate the held buckets and wait for the rebuild (inside the recording, if any: it
        takes down their requests and the rebuild's frees)."""
        if self.holding == "placed":
            self.tensors = [self._empty(nbytes) for nbytes in self.layout.held]
        self._hook = self.module.register_forward_pre_hook(self._before_forward)

    def stop(self) -> None:
        """Free them all (after the recording: a trial's record ends with the steps it took)."""
        if self._hook is not None:
            self._hook.remove()
        self.tensors.clear()

    def _before_forward(self, *_: object) -> None:
        if self.rebuilt or self.measurement.steps < REBUILD_STEP or not torch.is_grad_enabled():
            return
        self.rebuilt = True
        if self.holding == "placed":
            self.tensors.clear()
        self.tensors.extend(self._empty(nbytes) for nbytes in self.layout.rebuilt)

    def _empty(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8, device=self.device)


@contextlib.contextmanager
def trial_buckets(
    layout: BucketLayout, module: torch.nn.Module, device: Device, measurement: Measurement
) -> Iterator[TrialBuckets | None]:
    """A training trial's ``TrialBuckets`` on ``device``, stopped at the block's end; None where the
    device counts buckets as bytes or ``layout`` has no rebuild to come."""
    if device.bucket_holding == "counted" or not layout.rebuilds:
        yield None
        return
    buckets = TrialBuckets(layout, module, device.torch_device, device.bucket_holding, measurement)
    try:
        yield buckets
    finally:
        buckets.stop()

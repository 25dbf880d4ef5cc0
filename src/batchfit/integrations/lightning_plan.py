"""The plan ``BatchfitCallback`` sets and keeps in checkpoints (the sizes and what they were found
for), and the split of the global batch it keeps into equal micro-batches."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from batchfit.errors import ConfigurationError
from batchfit.policy.plan.micro_batch import chosen_micro_batch

#: The checkpoint's key for the plan: ``torch.load(path)["batchfit"]``.
CHECKPOINT_KEY = "batchfit"


@dataclass(frozen=True)
class LightningPlan:
    """The sizes the callback set and what they were found for, as checkpoints keep them:
    ``global_batch_size = micro_batch_size x accumulation_steps x world_size``."""

    micro_batch_size: int | None  # the train batch per device per forward (None: not searched)
    accumulation_steps: int
    world_size: int
    eval_batch_size: int | None  # None: not searched
    devices: tuple[str, ...]  # every rank's device, in rank order
    memory_fraction: float
    batchfit_version: str

    @property
    def global_batch_size(self) -> int | None:
        if self.micro_batch_size is None:
            return None
        return self.micro_batch_size * self.accumulation_steps * self.world_size

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "devices": list(self.devices), "global_batch_size": self.global_batch_size}

    @classmethod
    def from_dict(cls, document: dict[str, Any]) -> LightningPlan:
        values = {field.name: document[field.name] for field in fields(cls)}
        return cls(**{**values, "devices": tuple(values["devices"])})

    def summary(self) -> str:
        parts = []
        if self.micro_batch_size is not None:
            parts.append(
                f"global_batch_size {self.global_batch_size} = micro_batch_size {self.micro_batch_size} "
                f"x accumulation_steps {self.accumulation_steps} x world_size {self.world_size}"
            )
        if self.eval_batch_size is not None:
            parts.append(f"eval_batch_size {self.eval_batch_size}")
        return f"{'; '.join(parts)} (memory_fraction {self.memory_fraction:g} of {', '.join(self.devices)})"


@dataclass(frozen=True)
class GlobalBatch:
    """The global batch a fit keeps: its samples, and in words where it comes from (the loader's
    batch size x ``accumulate_grad_batches`` x world size, or ``sizes.global_batch_size``)."""

    samples: int
    source: str
    configured: bool  # the Trainer's own configuration, not a global_batch_size passed


def split_global_batch(target: GlobalBatch, world_size: int, largest: int) -> tuple[int, int]:
    """``(micro_batch_size, accumulation_steps)``: ``target`` in equal micro-batches of at most
    ``largest`` samples (the largest divisor of each rank's share), as ``plan`` splits one.

    Lightning divides every accumulated batch's loss by ``accumulate_grad_batches``: the step is the
    full batch's mean only where the micro-batches are equal, so an uneven split is never made; a
    split into micro-batches under half of ``largest`` is refused, with global batches that split."""
    try:
        micro = chosen_micro_batch(target.samples, world_size, largest)
    except ConfigurationError as error:
        raise ConfigurationError(_unsplittable(target, world_size, largest)) from error
    return micro, target.samples // (world_size * micro)


def _unsplittable(target: GlobalBatch, world_size: int, largest: int) -> str:
    per_device = target.samples // world_size
    divisor = max(size for size in range(1, largest + 1) if per_device % size == 0)
    step = world_size * largest
    below, above = target.samples // step * step, (target.samples // step + 1) * step
    nearby = f"{below} or {above}" if below else f"{above}"
    what = f"the configured global batch, {target.samples}" if target.configured else target.source
    where = f" ({target.source})" if target.configured else ""
    instead = (
        f", or keep_global_batch_size=False to train the {largest} that fit at the Trainer's "
        f"accumulate_grad_batches (a global batch of {largest} x accumulate_grad_batches x world_size)"
        if target.configured
        else ""
    )
    return (
        f"{what}{where} is {per_device} samples per device, and the largest micro-batch that divides "
        f"it up to the {largest} that fit is {divisor} ({per_device // divisor} accumulation steps), "
        f"under half of {largest}. Lightning weights every accumulated batch equally, so micro-batches "
        f"of another size would change the step. Pass sizes=batchfit.BatchSizes(global_batch_size=N) "
        f"with N a multiple of world_size x {largest} ({nearby}){instead}."
    )


def plan_changes(saved: LightningPlan | None, now: Mapping[str, Any]) -> str:
    """What differs from when ``saved`` was found (empty: nothing): each of ``now``'s values (keys
    of ``LightningPlan.to_dict``) against the plan's."""
    if saved is None:
        return "no plan in the checkpoint"
    then = {**saved.to_dict(), "devices": list(saved.devices)}
    return "; ".join(
        f"{name} {then[name]} then, {value} now" for name, value in now.items() if then[name] != value
    )

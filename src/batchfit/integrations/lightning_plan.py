"""The plan ``BatchfitCallback`` sets and keeps in checkpoints: the sizes and what they were found for."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

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

"""What the search works over: the candidate batch sizes, a forecast of their verdicts, and the outcome."""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Literal, Protocol

from batchfit.checks import check_batch_range, check_positive_int
from batchfit.errors import ConfigurationError
from batchfit.policy.trial import MemoryModel, Trial

StopReason = Literal["boundary", "max_batch_size", "min_batch_size_failed", "predicted"]


@dataclass(frozen=True)
class Candidates:
    """The batch sizes allowed: multiples of ``multiple_of`` in [min_batch_size, max_batch_size]."""

    first: int
    step: int
    count: int

    @classmethod
    def between(cls, min_batch_size: int, max_batch_size: int, multiple_of: int | None = None) -> Candidates:
        check_batch_range(min_batch_size, max_batch_size)
        step = 1 if multiple_of is None else check_positive_int("multiple_of", multiple_of)
        first = -(-min_batch_size // step) * step
        last = max_batch_size // step * step
        if first > last:
            raise ConfigurationError(
                f"no multiple of {step} lies in [min_batch_size, max_batch_size] = "
                f"[{min_batch_size}, {max_batch_size}]; widen the range or change multiple_of."
            )
        return cls(first, step, (last - first) // step + 1)

    def batch(self, index: int) -> int:
        return self.first + index * self.step

    def index_at_most(self, batch_size: float) -> int:
        """Index of the largest candidate <= batch_size (-1 if none)."""
        return math.floor((batch_size - self.first) / self.step)


class Forecast(Protocol):
    """What the real trials run so far say of another batch size, before it runs: fits or not,
    None where they cannot say (``policy.allocation_replay``: a caching allocator's requests, replayed)."""

    def fits(self, batch_size: int) -> bool | None: ...

    def evidence(self) -> Hashable:
        """What the answers rest on now (the replay: its pair of recorded trials); where it
        changes, the answers may have."""
        ...


@dataclass(frozen=True)
class SearchOutcome:
    batch_size: int | None
    trials: tuple[Trial, ...]
    memory_model: MemoryModel | None
    stop_reason: StopReason
    confirmed: bool = False  # the answer's own trial was the longer, confirming one, and fitted

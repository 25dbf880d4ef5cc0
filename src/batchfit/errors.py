"""The library's exceptions: one base class, each also a natural builtin."""

from __future__ import annotations

from typing import Any


class BatchfitError(Exception):
    """Base class of every error batchfit raises on purpose."""


class ConfigurationError(BatchfitError, ValueError):
    """A parameter, flag or workload is not usable as given; the message names it."""


class ArgumentTypeError(ConfigurationError, TypeError):
    """An argument of a public entry (a verb, an options object, ``MicroBatchStep``, an adapter) has a
    type it cannot take; the message says what it expected, what it got and what to pass."""


class DeviceUnavailableError(BatchfitError, RuntimeError):
    """The requested device is not present, or a memory query on it failed."""


class RankFailedError(BatchfitError, RuntimeError):
    """Another rank of a lockstep search (torch.distributed) raised; this rank stopped with it."""


class DoesNotFitError(BatchfitError, RuntimeError):
    """Even the smallest allowed batch does not fit in the memory budget. Where a search raised
    it, ``trial`` is the smallest batch's trial (a ``batchfit.policy.search.trial.Trial``), and
    ``budget_bytes`` and
    ``capacity_bytes`` the budget it failed and the capacity that budget is a share of."""

    def __init__(
        self,
        message: str,
        *,
        trial: Any = None,
        budget_bytes: int | None = None,
        capacity_bytes: int | None = None,
    ) -> None:
        super().__init__(message)
        self.trial, self.budget_bytes, self.capacity_bytes = trial, budget_bytes, capacity_bytes


class NonFiniteError(BatchfitError, FloatingPointError):
    """A trial's step does not train: its loss, or the gradients or parameters after it, hold NaN or
    inf (where no GradScaler skips the step for it); the message names the batch size and the step."""


class OptimizerStepOutOfMemoryError(DoesNotFitError):
    """An out-of-memory inside a ``MicroBatchStep``'s optimizer step: the parameters and the optimizer
    state may be partly updated, so the step is not run again; load a checkpoint to go on."""


class HostOutOfMemoryError(BatchfitError, MemoryError):
    """The host's own allocator failed (``ENOMEM``, ``std::bad_alloc``, a cgroup's or ``ulimit
    -v``'s limit) where the memory measured is a budget of another size (a ``memory_limit`` on
    the CPU, a GPU): the machine ran out, not the budget, so the search stops rather than answer
    from it. ``batch_size`` is the batch that ran out, ``budget_bytes`` the budget and
    ``host_bytes`` what the host could give the trials when they began."""

    def __init__(self, message: str, *, batch_size: int, budget_bytes: int, host_bytes: int) -> None:
        super().__init__(message)
        self.batch_size, self.budget_bytes, self.host_bytes = batch_size, budget_bytes, host_bytes

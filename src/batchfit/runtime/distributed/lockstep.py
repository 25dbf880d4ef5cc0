"""The ranks of an initialised process group searching together (torchrun, DDP).

Every rank runs the same search policy on the same trials: each rank runs the candidate on its
own device, then one ``all_gather_object`` per trial hands every rank everyone's result, which
``policy.search.ranks.merge_trials`` turns into the one trial all act on. A rank whose step raises (not an
out-of-memory) or is interrupted still takes part in that collective, with its error, so every
rank raises after the same trial and none waits on a rank that is gone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import torch.distributed as dist

from batchfit.errors import RankFailedError
from batchfit.policy.allocator.allocation_replay import Played
from batchfit.policy.search.ranks import merge_trials
from batchfit.policy.search.replay_forecast import ReplayForecast
from batchfit.policy.search.trial import Trial
from batchfit.runtime.steps.timer import StepTimer

T = TypeVar("T")


class Lockstep:
    """The ranks of ``group`` (the default process group when None)."""

    def __init__(self, group: Any = None) -> None:
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)

    @classmethod
    def current(cls) -> Lockstep | None:
        """The default process group when one of two or more ranks is initialised, else None."""
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            return cls()
        return None

    def shared(self, make: Callable[[], T]) -> T:
        """Rank 0's ``make()``, on every rank (a forecast: the ranks agree where to place trials)."""
        return self.run(make if self.rank == 0 else lambda: None)[0]  # type: ignore[return-value]

    def trial(self, run: Callable[[], Trial]) -> Trial:
        """This rank's trial, merged with every other rank's at the same batch size."""
        return merge_trials(self.run(run))

    def run(self, work: Callable[[], T]) -> list[T]:
        """``work()`` on this rank, and every rank's result (index = rank). When any rank raised,
        every rank raises after this one collective: the rank that failed its own error, the others
        ``RankFailedError`` naming the first rank that failed and its error."""
        error: BaseException | None = None
        try:
            payload: tuple[str, Any] = ("value", work())
        except BaseException as raised:  # KeyboardInterrupt too: the others must hear of it
            error = raised
            payload = ("error", f"{type(raised).__name__}: {raised}".strip())
        gathered = self._gather(payload)
        if error is not None:
            error.add_note(f"batchfit: on rank {self.rank} of {self.world_size}; every rank stopped with it.")
            raise error
        failures = [(rank, message) for rank, (kind, message) in enumerate(gathered) if kind == "error"]
        if failures:
            rank, message = failures[0]
            raise RankFailedError(
                f"rank {rank} of {self.world_size} raised {message}; every rank stopped with it. "
                f"Fix the error on rank {rank} (its own traceback says where)."
            )
        return [value for _, value in gathered]

    def forecast(self, local: ReplayForecast) -> LockstepForecast:
        """``local``'s forecast, agreed by every rank."""
        return LockstepForecast(local, self)

    def meter(self, timer: StepTimer) -> LockstepMeter:
        """``timer``'s windows, timed by every rank at once."""
        return LockstepMeter(timer, self)

    def _gather(self, payload: tuple[str, Any]) -> list[Any]:
        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, payload, group=self.group)
        return gathered


class Alone:
    """One process searching alone, behind the same methods as ``Lockstep``: a verb asks
    ``ranks()`` once and never branches on whether other ranks take part."""

    rank = 0
    world_size = 1

    def shared(self, make: Callable[[], T]) -> T:
        return make()

    def trial(self, run: Callable[[], Trial]) -> Trial:
        return run()

    def run(self, work: Callable[[], T]) -> list[T]:
        return [work()]

    def forecast(self, local: ReplayForecast) -> ReplayForecast:
        return local

    def meter(self, timer: StepTimer) -> StepTimer:
        return timer


def ranks() -> Lockstep | Alone:
    """The ranks searching together: an initialised group of two or more, else this process alone."""
    return Lockstep.current() or Alone()


class LockstepForecast:
    """The replay forecast every rank agrees on: each rank replays its own records on its own
    device's cap, one collective per size, and a size fits where it fits every rank (None where any
    rank cannot say), so every rank places the same trials."""

    def __init__(self, local: ReplayForecast, lockstep: Lockstep) -> None:
        self.local, self.lockstep = local, lockstep

    @property
    def replays_run(self) -> int:
        """The most sizes any rank replayed (each replays its own records until its verdict is
        known): one collective, read once at the search's end on every rank."""
        return max(self.lockstep.run(lambda: self.local.replays_run))

    def fits(self, batch_size: int) -> bool | None:
        answers = self.lockstep.run(lambda: self.local.fits(batch_size))
        return None if any(answer is None for answer in answers) else all(answers)

    def evidence(self) -> tuple[tuple[int, int] | None, ...]:
        """Every rank's pair of records, in rank order (so every rank sees the same change)."""
        return tuple(self.lockstep.run(self.local.evidence))

    def play(self, batch_size: int, limit_bytes: int) -> Played | None:
        """Every rank's replay at ``batch_size``: it fits where it fits every rank, with the
        largest rank's peaks (None where any rank cannot say)."""
        played = self.lockstep.run(lambda: self.local.play(batch_size, limit_bytes))
        if any(one is None for one in played):
            return None
        known = [one for one in played if one is not None]
        return Played(
            all(one.fits for one in known),
            max(one.peak_allocated_bytes for one in known),
            max(one.peak_reserved_bytes for one in known),
        )


class LockstepMeter:
    """Explore's meter on every rank at once: each rank times the same window on its own device,
    and all read the slowest rank's throughput (the pace of a job whose ranks wait for each
    other) and rank 0's clock, so every rank takes the same decisions."""

    def __init__(self, timer: StepTimer, lockstep: Lockstep) -> None:
        self.timer, self.lockstep = timer, lockstep

    def first_visit(self, batch_size: int) -> None:
        def visit() -> int:
            self.timer.first_visit(batch_size)
            return self.timer.steps[batch_size]

        self.timer.use_window_steps(batch_size, max(self.lockstep.run(visit)))

    def revisit(self, batch_size: int) -> None:
        self.lockstep.run(lambda: self.timer.revisit(batch_size))

    def window(self, batch_size: int) -> float:
        return min(self.lockstep.run(lambda: self.timer.window(batch_size)))

    def end_round(self) -> None:
        self.lockstep.run(self.timer.end_round)

    def now(self) -> float:
        return self.lockstep.shared(self.timer.now)

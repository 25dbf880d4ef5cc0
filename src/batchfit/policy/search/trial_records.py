"""The allocator requests of a search's trials that fitted, by batch size: one owner, which the
trial runners add to and the replay forecast reads."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from batchfit.policy.allocator.allocation_record import AllocationRecord


class TrialRecords(Mapping[int, AllocationRecord]):
    """The records of the trials that fitted, by batch size, in the order they were added (a size
    recorded again keeps its place and takes the new record). One search makes one and hands it to
    its trial runners (``add``) and to its ``ReplayForecast`` (which reads it); searches that share
    a ``TrialCache`` share the cache's. Read as a mapping, it cannot be changed through one."""

    def __init__(self, records: Mapping[int, AllocationRecord] | None = None) -> None:
        self._records: dict[int, AllocationRecord] = dict(records or {})

    def add(self, record: AllocationRecord) -> None:
        """A trial at ``record.batch_size`` fitted and left ``record``."""
        self._records[record.batch_size] = record

    def discard(self, batch_size: int) -> None:
        """The record at ``batch_size`` no longer stands (its trial runs again)."""
        self._records.pop(batch_size, None)

    def join(self, other: Mapping[int, AllocationRecord]) -> None:
        """``other``'s records join these (a saved prediction's, before the trials run); at a size
        both hold, ``other``'s replaces this one's."""
        self._records.update(other)

    def __getitem__(self, batch_size: int) -> AllocationRecord:
        return self._records[batch_size]

    def __iter__(self) -> Iterator[int]:
        return iter(self._records)

    def __len__(self) -> int:
        return len(self._records)

    def __repr__(self) -> str:
        return f"TrialRecords(sizes={list(self._records)})"

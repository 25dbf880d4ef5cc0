"""The one owner of a search's allocator records: added to by the runners, read by the replay."""

from __future__ import annotations

import pytest

from batchfit.policy.allocator.allocation_record import ALLOC, FREE, AllocationRecord
from batchfit.policy.search.trial_records import TrialRecords


def record(batch_size: int, steps: int = 2) -> AllocationRecord:
    """A trial's requests: per step, the activations (1 KiB a sample) taken and given back."""
    step = ((ALLOC, 1024 * batch_size), (FREE, 0))
    return AllocationRecord(batch_size, (), ((),) + (step,) * steps)


def test_records_keep_the_order_they_were_added_in_and_a_size_recorded_again_its_place() -> None:
    records = TrialRecords()
    for size in (4, 2, 16):
        records.add(record(size))
    again = record(2, steps=3)  # the trial at 2 ran again
    records.add(again)
    assert list(records) == [4, 2, 16] and len(records) == 3
    assert records[2] is again and 2 in records and 8 not in records
    records.discard(16)
    records.discard(8)  # nothing there: nothing to do
    assert list(records.items()) == [(4, records[4]), (2, again)]
    assert repr(records) == "TrialRecords(sizes=[4, 2])"


def test_joined_records_go_after_the_others_and_replace_those_at_the_same_size() -> None:
    # As a dict's update: the saved prediction's records join the cache's.
    mine, theirs = {4: record(4), 2: record(2)}, {2: record(2, steps=3), 8: record(8)}
    records = TrialRecords(mine)
    records.join(theirs)
    expected = dict(mine)
    expected.update(theirs)
    assert dict(records) == expected and list(records) == [4, 2, 8]
    assert records[2] is theirs[2]


def test_the_records_change_only_through_their_owner() -> None:
    made_from = {2: record(2)}
    records = TrialRecords(made_from)
    made_from[4] = record(4)  # the mapping it was made from is not it
    assert list(records) == [2]
    with pytest.raises(TypeError):
        records[4] = record(4)  # type: ignore[index]
    with pytest.raises(TypeError):
        del records[2]  # type: ignore[attr-defined]
    assert list(records) == [2] and TrialRecords() == {}

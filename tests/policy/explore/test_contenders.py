"""Which sizes explore times: contenders, refinements and lone dips, on fixed measurements."""

from __future__ import annotations

from batchfit.policy.explore.choose import Recommendation
from batchfit.policy.explore.contenders import KEEP_CHANCE, focus_sizes, lone_dips, refinement
from batchfit.policy.explore.throughput import Point


def test_contenders_and_refinements() -> None:
    measured = [1, 2, 4, 8, 16, 32, 64]
    current = Recommendation(batch_size=8, best_batch_size=32, base_batch_size=1, speedup=3.0, confidence=50)
    # The recommendation and the size below it; the fastest and the size above it.
    assert focus_sizes(measured, current) == {4, 8, 32, 64}
    top = Recommendation(batch_size=64, best_batch_size=64, base_batch_size=1, speedup=3.0, confidence=50)
    assert focus_sizes(measured, top) == {32, 64}
    # And any size that may still be within the tolerance: a former fastest two sizes away stays
    # compared with the recommendation in the same rounds.
    middle = Recommendation(batch_size=16, best_batch_size=16, base_batch_size=1, speedup=3.0, confidence=50)
    assert focus_sizes(measured, middle, {8: 0.0, 16: 0.7, 32: 0.1, 64: 0.3}) == {8, 16, 32, 64}
    assert focus_sizes(measured, middle, {8: 0.0, 16: 0.7, 32: 0.1, 64: KEEP_CHANCE / 2}) == {
        8,
        16,
        32,
    }
    candidates = list(range(1, 65))
    # The smallest-within rule refines below the recommendation only (where its answer may lie) ...
    # The roundest size in between, nearest the geometric middle: 12 between 8 and 16, 48 between
    # 32 and 64, 36 among multiples of 3 between 24 and 48.
    assert refinement(candidates, measured, 16, "smallest-within-tolerance") == 12
    assert refinement(candidates, measured, 64, "smallest-within-tolerance") == 48
    assert refinement(list(range(3, 49, 3)), [24, 48], 48, "smallest-within-tolerance") == 36
    assert refinement(candidates, [4, 5, 16], 5, "smallest-within-tolerance") is None
    # ... max-throughput on both sides, below first.
    assert refinement(candidates, [4, 5, 16], 5, "max-throughput") == 8
    assert refinement([1, 2, 4, 8], [1, 2, 4, 8], 2, "max-throughput") is None


def test_a_lone_dip_is_compared_again() -> None:
    """The transformer's coarse pass in one bench run: 32 read 0.84 of the best in a round of its
    own, between 16 and 64 (compared in rounds, 0.92). A dip that recovers is more likely a slow
    spell than the batch size: it is flagged, and no longer once compared in a round."""
    coarse = {8: 30000.0, 16: 31000.0, 32: 26000.0, 64: 30500.0, 128: 27000.0}

    def points(checked: bool) -> list[Point]:
        found = []
        for index, (batch, rate) in enumerate(coarse.items()):
            rounds = (index, index)
            if batch in (16, 64) or (checked and batch == 32):
                rounds = (index, 10)  # the second window in a shared round
            found.append(Point(batch, (rate, rate * 1.01), rounds))
        return found

    assert lone_dips(points(checked=False)) == {32}
    assert lone_dips(points(checked=True)) == set()
    # The ends of the range and sizes on a falling or rising stretch are not dips.
    falling = ((1, 5.0), (2, 9.0), (4, 8.0), (8, 7.0))
    assert lone_dips([Point(b, (r,), (i,)) for i, (b, r) in enumerate(falling)]) == set()

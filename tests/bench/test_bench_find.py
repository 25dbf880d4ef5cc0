"""The GPU benchmark's truth (bench/find.py): the largest batch that fits, by galloping and bisecting."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# bench/ is a directory of scripts, not a package: its directory goes on the path.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import find as find_bench


@pytest.mark.parametrize("limit", [0, 1, 2, 7, 100, 123, 511, 512])
@pytest.mark.parametrize("start", [1, 5, 100, 124, 300, 512])
def test_the_truth_is_the_largest_that_fits(limit: int, start: int) -> None:
    probed: list[int] = []

    def fits(batch: int) -> bool:
        probed.append(batch)
        return batch <= limit

    true_max, first_failure = find_bench.largest_fitting(fits, start, 512)
    assert true_max == (limit or None)
    assert first_failure == limit + 1
    assert all(1 <= batch <= 512 for batch in probed)
    assert len(set(probed)) == len(probed) <= 2 * 10 + 2  # no size twice; logarithmically many

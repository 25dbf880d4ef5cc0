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


@pytest.mark.parametrize("kind", ["cpu", "cuda", find_bench.CPU_CACHING])
def test_the_summary_judges_lightning_against_each_device_s_target(
    kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Every kind of bench device has a target (cpu-caching had none, and its full run crashed here).
    ours = find_bench.MethodResult(64, [2, 4, 70, 64, 65], 1.0, 1.0)
    lightning = find_bench.MethodResult(64, [2, 4, 8, 16, 32, 64, 128, 96, 80, 72, 68, 66, 65], 3.0, 3.0)
    truth = find_bench.Truth(64, 512, 65, [], 1.0, {})
    row = find_bench.Row(find_bench.Case("cnn", "ref:64"), 2**27, truth, ours, {"lightning": lightning})
    find_bench.print_summary([row], kind)
    target = find_bench.LIGHTNING_TARGET[kind]
    verdict = "met" if 13 / 5 >= target and 3.0 >= target else "NOT met"
    expected = f"at most 1/{target:g} of Lightning's trials and time in every row: {verdict}"
    assert expected in capsys.readouterr().out

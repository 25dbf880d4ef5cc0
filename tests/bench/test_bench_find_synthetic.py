"""The synthetic allocator curves of bench/find_synthetic.py: well-formed devices (monotone
verdicts, 10 steps never fitting where 2 do not), on which both confirmation policies are exact."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from batchfit.policy.search.search import Candidates

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
import find_synthetic  # noqa: E402


@pytest.mark.parametrize("case", sorted(find_synthetic.CASES))
def test_curves_are_devices_the_search_is_exact_on(case: str) -> None:
    candidates = Candidates.between(1, 512)
    for seed in range(8):
        curve = find_synthetic.Curve(case, seed, 0.006)
        short = [curve.trial(b, 2).fits for b in range(1, 513)]
        long = [curve.trial(b, 10).fits for b in range(1, 513)]
        assert short == sorted(short, reverse=True) and long == sorted(long, reverse=True)  # monotone
        assert all(s or not lo for s, lo in zip(short, long, strict=True))  # 10 steps need more
        truth = curve.truth(512)
        inside = find_synthetic.inside(curve, candidates)
        after = find_synthetic.after(curve, candidates)
        assert inside.batch_size == after.batch_size == truth
        assert inside.confirmed and after.confirmed


@pytest.mark.parametrize("extra", [(), ("--jitter", "0.005")])
def test_the_script_prints_every_case(extra: tuple[str, ...]) -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH / "find_synthetic.py"), "--curves", "4", *extra],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    rows = [line.split() for line in done.stdout.splitlines()[1:]]
    assert {row[0] for row in rows} == set(find_synthetic.CASES)
    assert all(row[3] == "4/4" for row in rows)  # exact on every curve

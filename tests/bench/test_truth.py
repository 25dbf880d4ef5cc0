"""The benchmarks' truth (bench/_truth.py) on scripted curves: a scan that does not lean on the
answer it judges, goes to the true boundary, and judges each answer where fitting is not monotone."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest

# bench/ is a directory of scripts, not a package: its directory goes on the path.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from _truth import CHECK_STEPS, TRUTH_STEPS, Curve, judge, scan, spans, window
from find_curves import largest_fitting  # the truth find.py bisected with, from batchfit's answer

#: The H100's recorded verdicts over 10 steps near two boundaries (2026-11-25,
#: bench/data/h100-2026-11-25/find-curves-cuda-cnn-transformer.json).
H100_CNN = {*range(1, 156), 160}
H100_TRANSFORMER = {*range(1, 141), *range(145, 149), *range(153, 157)}


def oracle(
    fitting: set[int], fails_longer: set[int] = frozenset()
) -> tuple[Callable[[int, int], bool], list]:
    """A probe over a scripted curve: ``fitting`` train 10 steps, and of those ``fails_longer``
    not 20. Records every probe."""
    probes: list[tuple[int, int]] = []

    def probe(batch_size: int, steps: int) -> bool:
        probes.append((batch_size, steps))
        return batch_size in fitting and not (steps > TRUTH_STEPS and batch_size in fails_longer)

    return probe, probes


@pytest.mark.parametrize("boundary", [1, 7, 60, 124, 241, 400])
@pytest.mark.parametrize("offset", [-9, -1, 0, 1, 9])
def test_on_a_monotone_curve_only_the_boundary_is_exact(boundary: int, offset: int) -> None:
    answer = max(1, boundary + offset)
    probe, probes = oracle(set(range(1, boundary + 1)))
    curve = scan(probe, answer)
    low, high = window(answer)
    assert set(range(low, high + 1)) <= set(curve.fits)  # every size within 12% of the answer
    assert len(probes) == len(set(probes))  # none twice
    assert curve.monotone and curve.largest_fitting == boundary
    assert curve.first_failure_above(answer) == max(answer, boundary) + 1  # up to the true boundary
    verdict = judge(curve, answer)
    assert verdict.reference == boundary and verdict.exact == (answer == boundary)
    assert curve.trains == {answer: answer <= boundary}  # the answer's own 20-step check


@pytest.mark.parametrize("answer", [236, 241, 246])
def test_a_scan_of_width_0_checks_the_boundary_alone_and_walks_to_it(answer: int) -> None:
    # The GPU smoke's ResNet-50 AMP row (--window 0): the answer and the size above it, then one
    # size a step up or down to where fitting changes; a failure below the answer goes unseen.
    probe, probes = oracle({*range(1, 230), *range(232, 242)})
    curve = scan(probe, answer, width=0)
    assert curve.largest_fitting == 241 and curve.first_failure_above(min(answer, 241)) == 242
    assert set(curve.fits) == set(range(min(answer, 241), max(answer, 241) + 2))
    assert len(probes) == len(curve.fits) + 1  # and the answer's own 20-step check
    assert judge(curve, answer).exact == (answer == 241)
    assert 230 not in curve.fits  # what a scan of 12% would have seen (230-231 fail)


def test_the_scan_goes_past_any_fixed_ceiling_to_the_boundary() -> None:
    # The mlp on the H100 (2026-11-25): batchfit answered its bound, 512; Lightning 671, which
    # trained 20 steps; the bisected truth stopped at 512 and could not say that 671 fitted.
    probe, _ = oracle(set(range(1, 672)))
    curve = scan(probe, 512, [671, 512])
    assert curve.largest_fitting == 671 and curve.first_failure_above(512) == 672
    assert judge(curve, 671).exact  # Lightning, which has no bound
    assert judge(curve, 512, bound=512).exact  # batchfit, whose max_batch_size is 512
    assert not judge(curve, 512).exact and judge(curve, 512).reference == 671
    assert largest_fitting(lambda size: size <= 671, 512, 512) == (512, 513)  # the old truth


def test_the_scan_goes_down_where_nothing_near_the_answer_fits() -> None:
    probe, _ = oracle(set(range(1, 41)))
    curve = scan(probe, 100)
    assert curve.largest_fitting == 40 and judge(curve, 100).reference == 40
    assert not judge(curve, 100).exact and curve.trains[100] is False


def test_a_workload_that_always_fits_stops_at_the_reach_and_says_so() -> None:
    probe, _ = oracle(set(range(1, 10_000)))
    curve = scan(probe, 50, reach=80)
    assert curve.reach == 80 and max(curve.fits) == 80 and curve.first_failure_above(50) is None


@pytest.mark.parametrize(
    ("fitting", "first", "second"),
    [
        (H100_TRANSFORMER, 140, 156),  # batchfit's answers on the H100 and on the H200
        (H100_CNN, 155, 160),
    ],
)
def test_a_curve_that_is_not_monotone_is_judged_where_each_answer_lies(
    fitting: set[int], first: int, second: int
) -> None:
    # The bisected truth started from one method's answer and called it the maximum: from `first`
    # it says `first`, so an answer of `second` (the largest fitting size at or below the first
    # failure above it) was judged wrong; from `second`, the other way round.
    old_from_first, _ = largest_fitting(lambda size: size in fitting, first, 512)
    old_from_second, _ = largest_fitting(lambda size: size in fitting, second, 512)
    assert (old_from_first, old_from_second) == (first, second)
    for answer, others in ((first, [second]), (second, [first])):
        probe, _ = oracle(fitting)
        curve = scan(probe, answer, others)
        assert not curve.monotone and curve.fitting_above_a_failure
        assert judge(curve, first).exact and judge(curve, second).exact
        assert not judge(curve, first - 1).exact and judge(curve, first - 1).reference == first
    probe, _ = oracle(fitting)
    assert "fails" in scan(probe, first).describe()


def test_an_answer_that_fits_10_steps_and_not_20_is_not_exact() -> None:
    # Lightning's 24 on gpt2-tiny (2-step trials): it fits 2 steps and 10, not 20.
    probe, _ = oracle(set(range(1, 25)), fails_longer={24})
    verdict = judge(scan(probe, 24), 24)
    assert verdict.reference == 24 and verdict.trains is False and not verdict.exact


def test_the_probes_run_in_one_seeded_shuffle_with_the_checks() -> None:
    probe, probes = oracle(set(range(1, 131)))
    curve = scan(probe, 124, [114, 130])
    assert curve.order == probes
    sizes = [size for size, steps in probes if steps == TRUTH_STEPS]
    assert sizes != sorted(sizes) and sizes != sorted(sizes, reverse=True)  # neither way up
    checks = [index for index, (_, steps) in enumerate(probes) if steps == CHECK_STEPS]
    assert len(checks) == 3 and checks != list(range(len(probes) - 3, len(probes)))  # not all last
    again, _ = oracle(set(range(1, 131)))
    assert scan(again, 124, [114, 130]).order == probes  # the same seed, the same order
    other, _ = oracle(set(range(1, 131)))
    assert scan(other, 124, [114, 130], seed=1).order != probes


def test_the_curve_reads_back_from_its_results_file_form() -> None:
    probe, _ = oracle(H100_CNN)
    curve = scan(probe, 160, [176])
    again = Curve.from_dict(curve.to_dict())
    assert (again.fits, again.trains, again.order) == (curve.fits, curve.trains, curve.order)
    assert curve.to_dict()["described"] == curve.describe()
    assert curve.describe().startswith("fits 140-155, 160; fails 156-159, 161-")


def test_spans() -> None:
    assert spans([]) == ""
    assert spans([4, 1, 2, 3, 7, 9, 10]) == "1-4, 7, 9-10"

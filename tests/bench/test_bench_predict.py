"""predict's benchmark (bench/predict.py): the true largest batch read from the truth's curve, each
answer judged against the issue's targets and its band, and tiny cases run through it on the CPU
with CUDA's caching allocator modelled, train and eval: one recorded under a cap, its MemTracker
answer checked against MemTracker's own peaks, and one from the CPU alone, its band widened."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from tiny_workloads import build

from batchfit import Workload

# bench/ is a directory of scripts, not a package: its directory goes on the path.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import _predict_cases
import _predict_judged
import _tables_predict
import predict as predict_bench
from _capped import CPU_CACHING
from _truth import Curve


def test_the_true_largest_batch_is_the_last_that_fits_before_the_first_failure() -> None:
    # Not monotone: 40 fits past the failures at 36-39, as a caching allocator's curve may.
    curve = Curve({**{size: size <= 35 for size in range(30, 40)}, 40: True})
    assert _predict_judged.true_largest(curve) == 35
    assert _predict_judged.true_largest(Curve({size: True for size in range(8, 12)})) == 11  # no failure
    assert _predict_judged.true_largest(Curve({8: False})) is None


@pytest.mark.parametrize(
    ("answer", "truth", "share", "within"),
    [(33, 32, 0.03, True), (34, 32, 0.03, False), (103, 100, 0.03, True), (104, 100, 0.03, False),
     (95, 100, 0.05, True), (94, 100, 0.05, False), (None, 10, 0.03, None)],
)  # fmt: skip
def test_an_answer_is_within_3_percent_or_1_sample_of_the_truth(
    answer: int | None, truth: int, share: float, within: bool | None
) -> None:
    judged = _predict_judged.judged(answer, truth, share)
    assert judged.within is within
    if answer is not None:
        assert judged.error_samples == answer - truth
        assert judged.error_percent == pytest.approx(100 * (answer - truth) / truth)


@pytest.mark.parametrize(
    ("band", "inside"),
    [((30, 34), True), ((32, 32), True), ((33, 40), False), ((20, 31), False), ((None, 40), None),
     ((30, None), True), (None, None)],
)  # fmt: skip
def test_the_truth_is_in_the_band_between_its_ends_inclusive(
    band: tuple[int | None, int | None] | None, inside: bool | None
) -> None:
    # None below: the band has no lower end (nothing placed at the budget's lowest), so no verdict.
    assert _predict_judged.judged(32, 32, 0.03, band).truth_in_band is inside
    assert _predict_judged.judged(None, 32, 0.03, band).truth_in_band is inside  # an answer not needed


def tiny(device: torch.device) -> Workload:
    return build("cnn")


def test_a_tiny_case_records_under_one_cap_and_is_judged_by_the_truth_under_another() -> None:
    case = _predict_cases.PredictCase("cnn", "2MiB", ("4MiB",))
    done = predict_bench.bench_case(case, torch.device("cpu"), CPU_CACHING, 2**50, True, build=tiny)
    assert [row["mode"] for row in done["targets"]] == ["train", "eval"]
    for mode, row in zip(("train", "eval"), done["targets"], strict=True):
        assert [trial["batch_size"] for trial in done["recorded_trials"][mode]] == [2, 4, 8]
        curve = Curve.from_dict(row["truth"])
        largest = row["true_largest"]
        assert largest == _predict_judged.true_largest(curve)
        assert curve.first_failure_above(largest) == largest + 1
        ours = row["predicted"]
        assert ours["error_samples"] == ours["answer"] - largest and ours["within"] is not None
        assert ours["truth_in_band"] is (ours["band"][0] <= largest <= ours["band"][1])
        # MemTracker's answer: its peak at the answer fits the cap, and at the next size it does not.
        peaks, tracked, cap = row["memtracker_peaks"], row["memtracker"]["answer"], row["cap_bytes"]
        assert 0 <= peaks[tracked] <= cap and not 0 <= peaks[tracked + 1] <= cap
    train, evaluation = done["targets"]
    # An eval step keeps no activations for backward: more of it fits, by the truth and by MemTracker.
    assert evaluation["true_largest"] > train["true_largest"]
    assert evaluation["memtracker"]["answer"] > train["memtracker"]["answer"]
    table = _tables_predict.predict_table([{"path": "run.json", "code": None, **_record(), "cases": [done]}])
    assert "| cnn | train | 2MiB | 4MiB |" in table and "| cnn | eval | 2MiB | 4MiB |" in table
    assert "from the CPU alone" not in table  # the columns of a path no row ran are left out
    # A row from the CPU alone (the CUDA cases' ResNet-50 and GPT-2) gets its own four columns.
    ours = train["predicted"]
    alone = {
        **train,
        "cpu_alone": {**ours, "band": [1, 2], "error_samples": -3, "error_percent": -6.0, "within": False,
                      "truth_in_band": False},
    }  # fmt: skip
    both = _tables_predict.predict_table(
        [{"path": "run.json", **_record(), "cases": [{**done, "targets": [alone]}]}]
    )
    header, _, line = both.splitlines()[:3]
    assert header.count("|") == line.count("|") == 18
    assert "| from the CPU alone | error | within | truth in band |" in header
    assert f"| {ours['answer']} (1-2) | -3 (-6.0%) | no | no |" in line


def test_a_case_from_the_cpu_alone_widens_its_band_and_its_truth_holds_cuda_s_additions() -> None:
    # 64 MiB of cuBLAS's two workspaces, held from the start by the truth's probes too, and 4 MiB besides.
    case = _predict_cases.PredictCase("cnn", _predict_cases.CPU_ALONE, ("68MiB",), modes=("train",))
    done = predict_bench.bench_case(case, torch.device("cpu"), CPU_CACHING, 2**50, True, build=tiny)
    [row] = done["targets"]
    assert [part["share"] for part in done["unmodelled"]] == [0.03]  # cuDNN's: the tiny cnn convolves
    ours, largest = row["predicted"], row["true_largest"]
    low, high = ours["band"]
    assert low <= ours["answer"] <= high and high > low  # 3% of 68 MiB moves it by samples
    assert ours["truth_in_band"] is (low <= largest <= high)
    assert row["memtracker"] is None  # MemTracker judges the recorded cases only
    table = _tables_predict.predict_table([{"path": "run.json", **_record(), "cases": [done]}])
    assert done["recorded_by"] == {"train": "trace"}  # predict --device cpu's way: a fake-tensor trace
    assert "| cnn | train | cpu-alone (trace) | 68MiB |" in table


def _record() -> dict[str, object]:
    return {"code": {"commit": "0" * 40, "source": "git"}, "command": "python bench/predict.py",
            "written": "2026-11-26 00:00 UTC", "torch": torch.__version__, "device": "cpu",
            "device_name": "a CPU", "versions": {}}  # fmt: skip

"""find's benchmark (bench/find.py): its truth on the CPU stand-ins against brute force, each probe from
the model as built, one model per case, and its summary."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import torch
from tiny_workloads import build, classification_batch, float16_scaled

from batchfit import Workload
from batchfit.runtime.steps.reach import grad_scalers

# bench/ is a directory of scripts, not a package: its directory goes on the path.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import _find_rows
import find as find_bench
import find_curves
from _capped import FreshState
from _truth import TRUTH_STEPS, Curve, window


@pytest.mark.parametrize("limit", [0, 1, 2, 7, 100, 123, 511, 512])
@pytest.mark.parametrize("start", [1, 5, 100, 124, 300, 512])
def test_the_recording_finds_the_largest_that_fits_where_memory_grows(limit: int, start: int) -> None:
    probed: list[int] = []

    def fits(batch: int) -> bool:
        probed.append(batch)
        return batch <= limit

    true_max, first_failure = find_curves.largest_fitting(fits, start, 512)
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
    truth = Curve({size: size <= 64 for size in range(56, 72)}, {64: True})
    row = _find_rows.Row(find_bench.Case("cnn", "ref:64"), 2**27, truth, ours, {"lightning": lightning})
    _find_rows.print_summary([row], kind)
    target = _find_rows.LIGHTNING_TARGET[kind]
    verdict = "met" if 13 / 5 >= target and 3.0 >= target else "NOT met"
    expected = f"at most 1/{target:g} of Lightning's trials and time in every row: {verdict}"
    out = capsys.readouterr().out
    assert expected in out and "batchfit: exact 1/1" in out and "lightning: exact 1/1" in out


#: Two tiny cases, each a few seconds: the tests' MLP on the capped CPU, and on the CPU with CUDA's
#: caching allocator modelled under what a trial at 8 reserved.
TINY = [("cpu", "1.81MiB"), (find_bench.CPU_CACHING, "ref:8")]


@pytest.mark.parametrize(("kind", "cap"), TINY)
def test_the_bench_s_truth_on_a_cpu_stand_in_is_the_brute_force_curve(kind: str, cap: str) -> None:
    bench = find_bench.prepared(find_bench.Case("mlp", cap), torch.device("cpu"), kind, build=tiny)
    row = find_bench.bench_one(bench, {}, 1)
    truth = row.truth
    low, high = window(row.batchfit.answer)
    assert set(range(low, high + 1)) <= set(truth.fits)
    assert truth.first_failure_above(row.batchfit.answer) is not None  # it reached the boundary
    # Brute force: every size again, in order, on a bench of its own, 10 steps from the built model.
    again = find_bench.Bench(bench.case, bench.device, bench.cap_bytes, kind, build=tiny)
    assert {size: again.probe(size, TRUTH_STEPS) for size in sorted(truth.fits)} == truth.fits
    verdict = row.verdict("batchfit")
    assert verdict is not None and verdict.exact and verdict.trains
    payload = _find_rows.row_dict(row)
    assert payload["verdicts"]["batchfit"]["exact"] and Curve.from_dict(payload["truth"]).fits == truth.fits


def test_each_probe_of_the_truth_starts_from_an_unstepped_grad_scaler() -> None:
    # On the bisected truth a GradScaler's scale carried over from probe to probe, so two probes of
    # one size ran different steps: the first skipped its overflowing steps, the next did not.
    bench = find_bench.Bench(find_bench.Case("mlp", "1GiB"), torch.device("cpu"), 2**30, build=overflowing)
    workload, _ = bench.workload()
    (scaler,) = grad_scalers(workload.train_step)
    assert bench.probe(4, TRUTH_STEPS)
    lowered, trained = scaler.get_scale(), copy.deepcopy(workload.model.state_dict())
    assert lowered < 65536.0  # its first steps overflowed, and were skipped
    assert bench.probe(4, TRUTH_STEPS) and scaler.get_scale() == lowered
    again = workload.model.state_dict()
    assert all(torch.equal(again[name], value) for name, value in trained.items())  # the same steps


def tiny(device: torch.device) -> Workload:
    return build("mlp")


def overflowing(device: torch.device) -> Workload:
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    workload = Workload(
        model=model,
        optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
        make_batch=classification_batch((64,)),
    )
    return float16_scaled(workload, torch.amp.GradScaler("cpu"), loss_scale=1e3)  # overflows at first


def test_every_method_trains_the_case_s_one_model_put_back_as_built() -> None:
    # One model in one place for the reference cap, every method, the confirming runs and the
    # truth: a model built anew per method sits elsewhere in an expandable segment, and the
    # methods then judge the same batch differently (the H200's expandable run).
    bench = find_bench.Bench(find_bench.Case("cnn", "64MiB"), torch.device("cpu"), 64 * 2**20)
    workload, state = bench.workload()
    built = {name: value.clone() for name, value in workload.model.state_dict().items()}
    places = [parameter.data_ptr() for parameter in workload.model.parameters()]
    bench.train_steps(workload, state.optimizer, workload.host_batch(4), 2)
    assert state.optimizer.state
    assert any(parameter.grad is not None for parameter in workload.model.parameters())
    again, state_again = bench.workload()
    assert again is workload and state_again is state
    assert [parameter.data_ptr() for parameter in again.model.parameters()] == places
    assert all(torch.equal(value, built[name]) for name, value in again.model.state_dict().items())
    assert not state.optimizer.state and all(parameter.grad is None for parameter in again.model.parameters())


def test_each_method_starts_from_an_unstepped_grad_scaler_and_its_trials_carry_the_scale() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    workload = float16_scaled(
        Workload(
            model=model,
            optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
            make_batch=classification_batch((64,)),
        ),
        torch.amp.GradScaler("cpu"),
        loss_scale=1e3,  # overflows a fresh scaler's first steps: its scale comes down
    )
    (scaler,) = grad_scalers(workload.train_step)
    state = FreshState(workload)
    workload.run_train_step(state.optimizer, workload.host_batch(4))
    lowered = scaler.get_scale()
    assert lowered < 65536.0
    state.reset()  # a trial's reset within a method: the scale stays where training brought it
    assert scaler.get_scale() == lowered
    state.restart()  # a method's start: as built, no scale made yet
    assert scaler._scale is None and scaler.get_scale() == 65536.0
    workload.run_train_step(state.optimizer, workload.host_batch(4))
    assert scaler.get_scale() == lowered  # the same steps from the same start: the same scale


def test_a_note_names_the_methods_after_which_the_gpu_kept_more() -> None:
    # The H200's expandable-segments rows: batchfit ran first and fitted 256 on the mlp, the truth
    # ran last and failed at 1. What each method leaves alive shrinks the room of those after it.
    mib = 1 << 20
    live = {"start": 100 * mib, "batchfit": 164 * mib, "lightning": 164 * mib, "truth": 190 * mib}
    assert find_bench.leftovers(live) == (
        "NOTE: live GPU memory changed across methods (batchfit +64.00 MiB, truth +26.00 MiB; the "
        "first matmul's cuBLAS workspaces stay for the process): what a method left shrinks the room "
        "of those after it"
    )
    assert find_bench.leftovers({"start": mib, "batchfit": mib + 1000, "truth": mib}) == ""
    assert find_bench.leftovers({}) == ""


def test_off_cuda_no_live_bytes_are_read() -> None:
    bench = find_bench.prepared(find_bench.Case("mlp", "36.75MiB"), torch.device("cpu"))
    assert bench.live_bytes() is None

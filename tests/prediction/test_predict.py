"""``predict`` on the CPU standing in for a GPU (CUDA's caching allocator modelled): recorded at
one capacity, predicted at others, judged by real trials at those capacities; the CPU-alone path's
additions and named gaps; and, on a GPU, the prediction against find under a capped allocator."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import batchfit
from batchfit import ConfigurationError, Targets, Trials
from batchfit.cli import main
from batchfit.policy.capacity.capacity_prediction import CapacityPredictor
from batchfit.prediction.predict import Recorder, predict_on, record
from batchfit.runtime.devices.caching_device import CachingCpuDevice
from batchfit.runtime.steps.runner import TrialRunner
from batchfit.runtime.steps.state import TrainingSnapshot
from batchfit.runtime.workloads.examples import build_example
from batchfit.search.find_batch_size import find_on
from batchfit.search.starting_evidence import Known, StartingEvidence
from batchfit.where import ResolvedDevice

MiB = 2**20


def _real_verdicts(workload: batchfit.Workload, mode: str, cap: int, sizes: range) -> dict[int, bool]:
    """Real 10-step trials on the modelled allocator at 0.8 x ``cap``, as find's confirming ones run."""
    device = CachingCpuDevice(cap)
    snapshot = TrainingSnapshot.capture(workload.module, workload.optimizer, workload.functions)
    snapshot.set_gradients_aside()
    try:
        runner = TrialRunner.on(
            workload, device, mode, 10, int(0.8 * cap), snapshot, 1 if mode == "eval" else None
        )  # type: ignore[arg-type]
        return {size: runner.run(size).fits for size in sizes}
    finally:
        snapshot.restore()
        device.release()


# cnn on the modelled allocator: recorded under 24 MiB, predicted at 48 and 64 MiB. Eval at 48 MiB
# is not monotone (33-39 fail, 40 fits): the answer is the largest size below the first failure.
@pytest.mark.parametrize(("mode", "capacity"), [("train", 48), ("train", 64), ("eval", 48)])
def test_recorded_on_one_capacity_predicted_at_another_is_the_truth(mode: str, capacity: int) -> None:
    workload = build_example("cnn")
    prediction = predict_on(
        Recorder(CachingCpuDevice(24 * MiB)),
        workload,
        Targets(f"{capacity}MiB", context=False),
        [mode],  # type: ignore[list-item]
    )
    answer = getattr(prediction.rows[0], mode).batch_size
    window = range(max(1, answer - 4), answer + 9)
    real = _real_verdicts(workload, mode, capacity * MiB, window)
    records, _ = record(workload, mode, CachingCpuDevice(24 * MiB), 0.8, Trials(), 1)  # type: ignore[arg-type]
    predictor = CapacityPredictor(records, 10)
    assert {size: predictor.play(size, int(0.8 * capacity * MiB)).fits for size in window} == real
    assert real[answer] and not real[answer + 1]
    assert all(real[size] for size in window if size <= answer)


def test_the_cpu_alone_models_cuda_s_additions_and_names_what_it_cannot() -> None:
    workload = build_example("cnn")
    before = [parameter.detach().clone() for parameter in workload.module.parameters()]
    prediction = batchfit.predict(
        workload, batchfit.Targets(gpus="T4,H100-80GB", capacities="2GiB"), device="cpu"
    )
    assert prediction.cpu_alone and [row.target for row in prediction.rows] == ["2GiB", "T4", "H100-80GB"]
    assert [part.part for part in prediction.unmodelled] == [
        "cuDNN's convolution workspaces (the algorithm CUDA picks)"
    ]
    assert any("cuBLAS's two workspaces" in part for part in prediction.modelled)
    for row in prediction.rows:
        for each in (row.train, row.eval):
            assert each is not None and each.batch_size is not None
            low, high = each.band
            assert low is not None and high is not None and low <= each.batch_size <= high
    small = prediction.rows[0].train
    assert small is not None and small.band[0] is not None and small.band[0] < small.batch_size  # widened
    json.dumps(prediction.to_dict())  # the records and trials are the evidence, in JSON
    assert all(torch.equal(a, b) for a, b in zip(before, workload.module.parameters(), strict=True))
    assert workload.module.training


def test_targets_must_name_one_and_known_cards() -> None:
    with pytest.raises(ConfigurationError) as raised:
        Targets()
    assert str(raised.value).startswith("predict needs a target: capacities=['24GiB'] (--capacities 24GiB)")
    with pytest.raises(ConfigurationError, match="gpu='A200' is not a card"):
        Targets(gpus="A200")
    assert Targets("24GiB, 40GiB", reserve="1GiB").capacities == ("24GiB", "40GiB")
    assert Targets(gpus="l4").reserve_bytes == 0


@pytest.mark.gpu
def test_on_cuda_the_prediction_at_a_capped_capacity_is_within_3_percent_of_find() -> None:
    from batchfit.runtime.devices.cuda import CudaDevice

    workload = build_example("cnn", device="cuda")
    cap = 384 * MiB
    prediction = predict_on(
        Recorder(CudaDevice(0, None)), workload, Targets(f"{cap}", context=False), ["train"]
    )
    found = batchfit.find_batch_size(workload, "train", device="cuda", memory_limit=cap)
    answer = prediction.rows[0].train
    assert answer is not None and answer.batch_size is not None
    tolerance = 1 if found.batch_size < 34 else 0.03 * found.batch_size
    assert abs(answer.batch_size - found.batch_size) <= tolerance


def test_find_started_from_a_saved_prediction_runs_fewer_trials_to_the_same_answer(tmp_path: Path) -> None:
    workload = build_example("cnn")
    prediction = predict_on(
        Recorder(CachingCpuDevice(24 * MiB)), workload, Targets("48MiB", context=False), ["train"]
    )  # type: ignore[list-item]
    saved = tmp_path / "prediction.json"  # as `batchfit predict --format json` writes it
    saved.write_text(json.dumps({"workload": "cnn", "prediction": prediction.to_dict()}))
    scratch = find_on(ResolvedDevice(CachingCpuDevice(48 * MiB), 0.8), workload, "train")
    start = StartingEvidence.read(saved, "train")
    started = find_on(
        ResolvedDevice(CachingCpuDevice(48 * MiB), 0.8), workload, "train", known=Known(start=start)
    )
    predicted = prediction.rows[0].train
    assert predicted is not None and scratch.started_from is None
    # The first trial goes where the prediction put it at this budget (0.8 x 48 MiB, as predicted).
    assert started.started_from == predicted.batch_size == started.trials[0].batch_size
    assert started.batch_size == scratch.batch_size
    assert len(started.trials) < len(scratch.trials), (started.trials, scratch.trials)
    assert (
        f"The first trial was at batch_size={predicted.batch_size}, where the saved prediction put it."
        in (started.summary())
    )


def test_a_saved_prediction_starts_a_search_only_behind_a_caching_allocator_and_in_a_mode_it_holds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    workload = build_example("cnn")
    prediction = predict_on(
        Recorder(CachingCpuDevice(24 * MiB)), workload, Targets("48MiB", context=False), ["train"]
    )  # type: ignore[list-item]
    with pytest.raises(ConfigurationError) as raised:
        batchfit.find_batch_size(workload, "eval", device="cpu", memory_limit="48MiB", start_from=prediction)
    assert str(raised.value) == (
        "start_from: the prediction given holds no eval records (its modes: train). Predict that mode too "
        "(batchfit predict --modes train,eval), or search from scratch without start_from."
    )
    saved = tmp_path / "p.json"
    saved.write_text(json.dumps({"prediction": prediction.to_dict()}))
    argv = [
        "find",
        "--example",
        "cnn",
        "--device",
        "cpu",
        "--memory-limit",
        "48MiB",
        "--start-from",
        str(saved),
    ]
    assert main(argv) == 2
    assert capsys.readouterr().err.startswith(
        f"batchfit: error: start_from: {saved} replays CUDA's caching allocator, which cpu (capped at "
        f"48.00 MiB) does not run: search on cuda (or leave start_from out; the CPU places its trials by "
        f"its own fake-tensor trace).\n"
    )

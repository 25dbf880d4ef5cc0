"""Fake-tensor traces predict the real trial's peak to the byte, and fall back when they cannot."""

from __future__ import annotations

import pytest
import torch
from tiny_workloads import build, untraceable

from batchfit import find_batch_size, memory_limit
from batchfit.runtime.devices.device import CappedCpuDevice
from batchfit.runtime.steps.runner import TrialRunner
from batchfit.runtime.steps.state import TrainingSnapshot
from batchfit.runtime.steps.trace import FakeTracer, TraceUnavailable
from batchfit.runtime.workloads.examples import build_example
from batchfit.runtime.workloads.workload import Workload


@pytest.mark.parametrize("name", ["mlp", "cnn", "transformer"])
@pytest.mark.parametrize("mode", ["train", "eval"])
def test_trace_equals_the_real_trial(name: str, mode: str) -> None:
    workload = build_example(name, "cpu")
    snapshot = TrainingSnapshot.capture(workload.model, workload.optimizer)  # type: ignore[arg-type]
    snapshot.set_gradients_aside()
    runner = TrialRunner.on(workload, CappedCpuDevice(2**33), mode, 2, 2**33, snapshot, 1)  # type: ignore[arg-type]
    tracer = FakeTracer(workload, mode, 2**33, 1)  # type: ignore[arg-type]
    try:
        for batch_size in (3, 8):
            real, predicted = runner.run(batch_size), tracer(batch_size)
            assert predicted.peak_bytes == real.peak_bytes
            assert predicted.activation_peak_bytes == real.activation_peak_bytes
    finally:
        snapshot.restore()


def test_trace_of_an_optimizer_under_a_scheduler_steps_its_fake_copy() -> None:
    # A learning-rate scheduler wraps the optimizer's step on the instance, holding the real
    # optimizer: the fake copy steps itself, so the trace counts the state a real trial makes.
    workload = build_example("mlp", "cpu")
    torch.optim.lr_scheduler.StepLR(workload.optimizer, step_size=1)  # type: ignore[arg-type]
    snapshot = TrainingSnapshot.capture(workload.model, workload.optimizer)  # type: ignore[arg-type]
    snapshot.set_gradients_aside()
    runner = TrialRunner.on(workload, CappedCpuDevice(2**33), "train", 2, 2**33, snapshot, 1)
    try:
        assert FakeTracer(workload, "train", 2**33, 1)(8).peak_bytes == runner.run(8).peak_bytes
    finally:
        snapshot.restore()


def test_tracing_allocates_nothing_real() -> None:
    workload = build_example("transformer", "cpu")
    tracer = FakeTracer(workload, "train", 2**40, 1)
    # 4096 sequences would take gigabytes for real; traced under a 64 MiB cap, nothing fails.
    with memory_limit("64MiB", resident=[workload.model, workload.optimizer]) as cap:
        trial = tracer(4096)
    assert trial.peak_bytes > 2 * 2**30 and cap.peak_bytes < 64 * 2**20


def test_untraceable_step_falls_back_to_real_trials() -> None:
    workload = untraceable("mlp", "adam")
    with pytest.raises(TraceUnavailable, match="DataDependentOutputException"):
        FakeTracer(workload, "train", 2**30, 1)(4)
    traced = find_batch_size(build("mlp"), device="cpu", memory_limit="2400000")
    result = find_batch_size(workload, device="cpu", memory_limit="2400000")
    assert result.predicted_trials == () and result.batch_size == traced.batch_size
    assert result.trials[0].batch_size == 2  # the real opening
    assert workload.losses  # type: ignore[attr-defined]  # the real steps ran and read their loss


def test_forecast_is_used_only_on_cpu_devices(mlp_workload: Workload) -> None:
    result = find_batch_size(mlp_workload, device="cpu", memory_limit="2400000")
    assert result.predicted_trials and len(result.trials) <= 3

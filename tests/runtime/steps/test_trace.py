"""Fake-tensor traces predict the real trial's peak to the byte, and fall back when they cannot."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
import torch
from tiny_workloads import adversarial, build, untraceable

from batchfit import cap_memory, find_batch_size
from batchfit.runtime.devices.caching_device import CachingCpuDevice
from batchfit.runtime.devices.device import CappedCpuDevice
from batchfit.runtime.steps.runner import TrialRunner
from batchfit.runtime.steps.state import TrainingSnapshot
from batchfit.runtime.steps.trace import FakeTracer, TraceUnavailable
from batchfit.runtime.workloads.examples import build_example
from batchfit.runtime.workloads.workload import Workload
from batchfit.search.find_batch_size import find_on
from batchfit.where import ResolvedDevice


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
    with cap_memory("64MiB", resident=[workload.model, workload.optimizer]) as cap:
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


def _stepped(workload: Workload) -> Workload:
    """``workload`` after one real training step: its optimizer holds state (Adam's ``step``)."""
    optimizer = workload.optimizer
    assert isinstance(optimizer, torch.optim.Optimizer) and workload.loss_fn is not None
    inputs, target = workload.host_batch(4)
    optimizer.zero_grad()
    workload.loss_fn(workload.model(inputs), target).backward()
    optimizer.step()
    return workload


OPTIMIZERS: dict[str, Callable[[Any], torch.optim.Optimizer]] = {
    "adam": lambda params: torch.optim.Adam(params, lr=1e-3),
    "adamw": lambda params: torch.optim.AdamW(params, lr=1e-3),
    "adamw-foreach": lambda params: torch.optim.AdamW(params, lr=1e-3, foreach=True),
    "adamw-fused": lambda params: torch.optim.AdamW(params, lr=1e-3, fused=True),
    "nadam": lambda params: torch.optim.NAdam(params, lr=1e-3),
    "sgd-momentum": lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9),
}


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_trace_equals_the_real_trial_once_the_optimizer_has_stepped(optimizer: str) -> None:
    workload = build("cnn")  # BatchNorm's num_batches_tracked is a 0-dim buffer too
    workload = _stepped(workload.replaced(optimizer=OPTIMIZERS[optimizer](workload.model.parameters())))
    snapshot = TrainingSnapshot.capture(workload.model, workload.optimizer)  # type: ignore[arg-type]
    snapshot.set_gradients_aside()
    runner = TrialRunner.on(workload, CappedCpuDevice(2**33), "train", 2, 2**33, snapshot, None)
    tracer = FakeTracer(workload, "train", 2**33, 3)
    try:
        for batch_size in (3, 8):
            assert tracer(batch_size).peak_bytes == runner.run(batch_size).peak_bytes
    finally:
        snapshot.restore()


def _with_adamw(name: str) -> Workload:
    workload = build("cnn") if name == "batchnorm-cnn" else build_example(name, "cpu")
    return workload.replaced(optimizer=torch.optim.AdamW(workload.model.parameters(), lr=1e-3))


@pytest.mark.parametrize(
    ("name", "limit"),
    [("mlp", "48MiB"), ("cnn", "24MiB"), ("transformer", "24MiB"), ("batchnorm-cnn", "4MiB")],
)
def test_a_search_after_a_training_step_runs_the_trials_of_a_fresh_one(name: str, limit: str) -> None:
    # Mid-training (a resume, apply_autobatch after a checkpoint) AdamW holds its step counters:
    # the forecast still places the trials, so the same few run.
    fresh = find_batch_size(_with_adamw(name), device="cpu", memory_limit=limit)
    trained = find_batch_size(_stepped(_with_adamw(name)), device="cpu", memory_limit=limit)
    assert trained.predicted_trials and trained.forecast_skipped == ""
    assert [t.batch_size for t in trained.trials] == [t.batch_size for t in fresh.trials]
    assert trained.batch_size == fresh.batch_size


def test_a_search_without_a_forecast_says_why() -> None:
    result = find_batch_size(untraceable("mlp", "adam"), device="cpu", memory_limit="2400000")
    why = (
        "the step cannot run on fake tensors (it reads a tensor's value, as .item(), float() or a shape "
        "set by the data do: DataDependentOutputException: aten._local_scalar_dense.default)"
    )
    assert result.predicted_trials == () and result.forecast_skipped == why
    assert result.summary().endswith(f" No fake-tensor forecast placed the trials: {why}.")
    assert json.loads(result.to_json())["forecast_skipped"] == why
    workload, _ = adversarial()  # its step trains a discriminator beside the model
    reached = find_batch_size(workload, device="cpu", memory_limit="4MiB")
    assert reached.forecast_skipped == (
        "the step updates state beside the model and optimizer (Sequential, Adam, AveragedModel), which "
        "a fake copy of the model and optimizer would not count"
    )
    caching = find_on(ResolvedDevice(CachingCpuDevice(2**22), 0.8), build("mlp"), "train")
    assert caching.predicted_trials == () and caching.forecast_skipped == ""  # it replays, by design

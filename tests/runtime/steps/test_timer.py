"""Explore's meter on real tiny models: windows at least the device's fewest steps, as long as
``min_window_seconds`` asks, and none that times the steps a fresh scaler skips."""

from __future__ import annotations

from typing import Any

import pytest
from test_steps import skipped_steps
from tiny_workloads import build, overflowing_workload

from batchfit.runtime.devices.cuda import WINDOW_STEPS, CudaDevice
from batchfit.runtime.devices.device import CpuDevice
from batchfit.runtime.steps.reach import grad_scalers
from batchfit.runtime.steps.timer import StepTimer


@pytest.mark.parametrize(("min_window_steps", "expected"), [(None, 1), (3, 3)])
def test_a_window_is_at_least_the_devices_fewest_steps(min_window_steps: int | None, expected: int) -> None:
    # A window long enough in seconds after one step is still min_window_steps steps long: on CUDA
    # (3, the device's) a window that starts on an idle GPU must not be one ramped-up step.
    with StepTimer(
        build("mlp"), CpuDevice(), min_window_seconds=1e-9, min_window_steps=min_window_steps
    ) as timer:
        timer.first_visit(16)
        assert timer.steps[16] == expected
        assert timer.unrestored_steps == 1 + expected  # the warm-up step, then the discarded window
        timer.window(16)
        assert timer.unrestored_steps == 1 + 2 * expected


def test_a_window_does_not_time_the_steps_a_fresh_scaler_skips_for_overflow() -> None:
    # A skipped step runs no optimizer: timed, it made the first batch size look faster than
    # training runs it. The warm-up steps on until the scale stops coming down.
    workload = overflowing_workload(1e3)
    skipped: list[bool] = []  # per step: whether the scaler skipped it
    (scaler,) = grad_scalers(workload.train_step)
    step = workload.train_step
    assert step is not None

    def watched(*args: Any) -> None:
        scale = scaler.get_scale()
        step(*args)
        skipped.append(scaler.get_scale() < scale)

    workload.train_step = watched
    with StepTimer(workload, CpuDevice(), min_window_seconds=1e-9, min_window_steps=2) as timer:
        timer.first_visit(16)
        warm_up = len(skipped) - 2  # the discarded window is the last 2
        timer.window(16)
        timer.window(16)
    assert warm_up == skipped_steps(overflowing_workload(1e3), 16) + 1
    assert not any(skipped[warm_up:])  # neither the discarded window nor a timed one


def test_the_cuda_device_asks_for_longer_windows_than_the_cpu() -> None:
    assert CpuDevice.min_window_steps == 1
    assert CudaDevice.min_window_steps == WINDOW_STEPS == 3


def test_a_window_takes_as_many_steps_as_min_window_seconds_asks() -> None:
    with StepTimer(build("mlp"), CpuDevice(), min_window_seconds=0.5) as timer:
        timer.first_visit(8)
        assert timer.steps[8] > 1  # an 8-sample step of the tiny MLP takes well under 500 ms

"""The step runner's timing windows (explore's meter) on a real tiny model."""

from __future__ import annotations

import pytest
from tiny_workloads import build

from batchfit.runtime.cuda import WINDOW_STEPS, CudaDevice
from batchfit.runtime.device import CpuDevice
from batchfit.runtime.steps import StepTimer


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


def test_the_cuda_device_asks_for_longer_windows_than_the_cpu() -> None:
    assert CpuDevice.min_window_steps == 1
    assert CudaDevice.min_window_steps == WINDOW_STEPS == 3


def test_a_window_takes_as_many_steps_as_min_window_seconds_asks() -> None:
    with StepTimer(build("mlp"), CpuDevice(), min_window_seconds=0.5) as timer:
        timer.first_visit(8)
        assert timer.steps[8] > 1  # an 8-sample step of the tiny MLP takes well under 500 ms

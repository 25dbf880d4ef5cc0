"""A measurement keeps its trial's last step, its peak inside the optimizer's step apart from the
peak outside it."""

from __future__ import annotations

import torch

from batchfit.runtime.devices.device import CpuDevice


def test_a_measurement_keeps_the_last_step_and_its_phases() -> None:
    device = CpuDevice()
    with device.measure([]) as measurement:
        measurement.begin_step()
        first = torch.empty(1_000_000)  # a first step's spike, 4 MB
        del first
        measurement.begin_step()  # the steady state: 1 MB outside the optimizer step, 2 MB in it
        outside = torch.empty(250_000)
        measurement.enter_optimizer_step()
        inside = torch.empty(500_000)
        del inside
        measurement.exit_optimizer_step()
        del outside
    assert (measurement.activation_peak_bytes, measurement.optimizer_peak_bytes) == (1_000_000, 3_000_000)
    assert measurement.peak_bytes == 3_000_000 and measurement.reserved_peak_bytes is None

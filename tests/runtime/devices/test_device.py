"""Devices: capacity, measurement, and the CUDA layer's refusal to take a 0 for a reading."""

from __future__ import annotations

import pytest
import torch

from batchfit.errors import ConfigurationError, DeviceUnavailableError
from batchfit.runtime.devices.caching_device import CachingCpuDevice
from batchfit.runtime.devices.cuda import CudaDevice, cuda_call
from batchfit.runtime.devices.device import CappedCpuDevice, CpuDevice
from batchfit.runtime.devices.resolve import resolve_device


def test_resolve() -> None:
    assert isinstance(resolve_device("cpu", None), CpuDevice)
    capped = resolve_device("cpu", "2GiB")
    assert isinstance(capped, CappedCpuDevice) and capped.capacity_bytes([]) == 2 * 1024**3
    assert capped.name == "cpu (capped at 2.00 GiB)"
    if not torch.cuda.is_available():
        assert isinstance(resolve_device(None, None), CpuDevice)


@pytest.mark.parametrize(
    ("device", "error", "message"),
    [
        ("tpu", ConfigurationError, "device='tpu' is not a device: use 'cpu', 'cuda' or 'cuda:N'."),
        (
            "xla",
            ConfigurationError,
            "device='xla' is not supported: batchfit measures 'cpu' and 'cuda' devices.",
        ),
    ],
)
def test_unknown_devices(device: str, error: type, message: str) -> None:
    with pytest.raises(error) as info:
        resolve_device(device, None)
    assert str(info.value) == message


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is present")
def test_cuda_absent_is_said_plainly() -> None:
    with pytest.raises(DeviceUnavailableError) as info:
        resolve_device("cuda:1", None)
    assert str(info.value).startswith(
        "device='cuda:1' was asked for, but CUDA is not available in this process"
    )
    assert "Use device='cpu' (with memory_limit='...' to stand in for a GPU's memory)." in str(info.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a CPU-only torch build")
def test_cuda_readings_on_a_cpu_build_are_errors_not_zeros() -> None:
    # On this build torch.cuda.memory_allocated() returns 0 and mem_get_info() raises:
    # both must surface as errors, never as a measurement.
    assert torch.cuda.memory_allocated() == 0
    with pytest.raises(
        DeviceUnavailableError, match=r"torch.cuda.memory_allocated returned 0, which is not a real"
    ):
        cuda_call(torch.cuda.memory_allocated)
    with pytest.raises(DeviceUnavailableError, match=r"torch.cuda.mem_get_info failed"):
        CudaDevice(0).capacity_bytes([])


def test_cpu_measures_the_peak_of_a_block() -> None:
    device = CpuDevice()
    model = torch.nn.Linear(1000, 1000)  # 4,004,000 bytes
    with device.measure(list(model.parameters())) as measurement:
        torch.empty(250_000)  # 1,000,000 bytes, freed at once
    assert measurement.peak_bytes == 4_004_000 + 1_000_000


@pytest.mark.parametrize("device", [CpuDevice(), CappedCpuDevice(2**30)], ids=["cpu", "capped-cpu"])
def test_a_measured_block_runs_under_its_cap(device: CpuDevice) -> None:
    model = torch.nn.Linear(500, 500)  # 1,002,000 bytes resident
    with device.measure(list(model.parameters()), cap_bytes=2_000_000) as measurement:
        torch.empty(240_000)  # 960,000 bytes: 1,962,000 in all, within the cap
    assert measurement.peak_bytes == 1_962_000
    with pytest.raises(torch.OutOfMemoryError, match="a limit of 2000000 bytes"):  # noqa: SIM117
        with device.measure(list(model.parameters()), cap_bytes=2_000_000):
            torch.empty(250_000)  # 1,000,000 bytes: 2,002,000 in all
    with pytest.raises(torch.OutOfMemoryError) as info:  # the resident tensors alone are past the cap
        device.measure(list(model.parameters()), cap_bytes=1_000_000).__enter__()
    assert str(info.value) == (
        "out of memory: DefaultCPUAllocator: can't allocate memory: the tensors already held (parameters, "
        "gradients, optimizer state) take 1002000 bytes (978.52 KiB), over the limit of 1000000 bytes "
        "(976.56 KiB) set by batchfit."
    )


def test_a_cap_below_what_the_allocator_caches_is_a_real_cap() -> None:
    # Behind a caching allocator the cap is checked when a new segment is asked for: a block capped
    # after an uncapped one that left 64 MiB cached must not place 64 MiB on that cache.
    device = CachingCpuDevice(2**40)
    big = 2**24  # float32 elements: 64 MiB
    with device.measure([], None):
        torch.ones(big)
    assert device.allocator.model.reserved_bytes >= 4 * big  # cached, not given back
    with pytest.raises(torch.OutOfMemoryError), device.measure([], 32 * 2**20):
        torch.ones(big)
    with device.measure([], 32 * 2**20) as measured:  # what fits the cap still runs under it
        torch.ones(big // 4)
    assert measured.peak_bytes >= big

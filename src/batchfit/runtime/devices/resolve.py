"""From what the user says (``cpu``, ``cuda:1``, ``memory_limit="2GiB"``) to a ``Device``, and
``cap_memory``, the block that caps memory as a device of that size would."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from batchfit.errors import ConfigurationError, DeviceUnavailableError
from batchfit.runtime.devices.cuda import CudaDevice
from batchfit.runtime.devices.device import CappedCpuDevice, CpuDevice, Device
from batchfit.runtime.devices.measurement import Measurement
from batchfit.runtime.devices.tracker import resident_tensors
from batchfit.units import parse_bytes


def name_device(device: str | torch.device) -> torch.device:
    """The device named: ``cpu``, ``cuda`` (no index: the current one, when it runs) or ``cuda:N``;
    errors say what to pass. Nothing is asked of the hardware."""
    shown = str(device) if isinstance(device, torch.device) else device
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise ConfigurationError(
            f"device={shown!r} is not a device: use 'cpu', 'cuda' or 'cuda:N'."
        ) from error
    if parsed.type == "meta":
        raise ConfigurationError(
            f"device={shown!r} is not supported: batchfit measures 'cpu' and 'cuda' devices; a "
            f"model built on the meta device is predicted from its shapes with batchfit.predict("
            f"workload, batchfit.Targets(capacities='24GiB'), device='cpu') (batchfit predict "
            f"--device cpu --capacities 24GiB)."
        )
    if parsed.type not in ("cpu", "cuda"):
        raise ConfigurationError(
            f"device={shown!r} is not supported: batchfit measures 'cpu' and 'cuda' devices."
        )
    return parsed


def parse_device(device: str | torch.device | None) -> torch.device:
    """The torch device the user means, found present: ``cpu``, ``cuda`` (the current one) or
    ``cuda:N``, and for None cuda if available, else cpu. Errors say what to pass."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    parsed = name_device(device)
    if parsed.type == "cpu":
        return torch.device("cpu")
    shown = str(device) if isinstance(device, torch.device) else device
    if not torch.cuda.is_available():
        raise DeviceUnavailableError(
            f"device={shown!r} was asked for, but CUDA is not available in this process "
            f"(torch {torch.__version__}, torch.version.cuda={torch.version.cuda}). "
            f"Use device='cpu' (with memory_limit='...' to stand in for a GPU's memory)."
        )
    index = parsed.index if parsed.index is not None else torch.cuda.current_device()
    if index >= torch.cuda.device_count():
        raise DeviceUnavailableError(
            f"device={shown!r} does not exist: {torch.cuda.device_count()} CUDA device(s) "
            f"are visible; use cuda:0 to cuda:{torch.cuda.device_count() - 1}."
        )
    return torch.device("cuda", index)


def resolve_device(device: str | torch.device | None, memory_limit: str | int | None) -> Device:
    """Turn the user's ``device`` and ``memory_limit`` into a ``Device``: on the CPU the limit is
    its capacity (it stands in for a GPU of that size); on CUDA it lowers the GPU's capacity."""
    limit = None if memory_limit is None else parse_bytes(memory_limit, name="memory_limit")
    parsed = parse_device(device)
    if parsed.type == "cpu":
        return CpuDevice() if limit is None else CappedCpuDevice(limit)
    return CudaDevice(parsed.index or 0, limit)


@contextmanager
def cap_memory(
    limit: str | int, *, resident: Iterable[Any] = (), device: str | torch.device = "cpu"
) -> Iterator[Measurement]:
    """Cap the memory of the code inside the block at ``limit`` (e.g. ``"2GiB"``), as a device of
    that size would: an allocation past it raises ``torch.OutOfMemoryError``.

    On the CPU, tensors allocated inside the block count, plus those of ``resident`` (modules,
    optimizers, tensors) that already exist, and any other a step writes into (a
    ``DistributedDataParallel`` built before the block counts its gradient buckets from its first
    backward, which writes into them); a view of a tensor alive when the block begins costs
    nothing, as on a GPU (a dataset's row is free, a copy of it costs its bytes). On CUDA
    (``device="cuda"``), the caching allocator of the whole process is capped, and the fraction in
    force before is put back after.
    The yielded measurement's ``peak_bytes`` is filled in when the block exits.
    """
    target = resolve_device(device, None)
    if isinstance(target, CpuDevice):
        target = CpuDevice(views_of_existing_free=True)
    with target.measure(resident_tensors(*resident), parse_bytes(limit, name="limit")) as measurement:
        yield measurement

"""The host's memory as a bound on a budget of another size: a CPU budget the host cannot give is
refused before a search, and the host's own allocator failing in a trial stops the search,
saying the machine ran out, where an out-of-memory of the budget would have answered from it."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from batchfit.errors import ConfigurationError, HostOutOfMemoryError
from batchfit.runtime.devices.device import Device, unique_storages
from batchfit.runtime.devices.host import HostMemory, host_memory
from batchfit.runtime.devices.oom import first_line, is_host_out_of_memory
from batchfit.units import format_bytes

MiB = 2**20


def stands_in_on_host(device: Device) -> bool:
    """Whether ``device`` is the CPU standing in for a device of another size (``memory_limit``):
    its trials' tensors are the host's, while its budget is not the host's memory."""
    return device.torch_device.type == "cpu" and not device.host_is_capacity and not device.fake


def check_host_room(
    device: Device,
    capacity_bytes: int,
    memory_fraction: float,
    held: Iterable[torch.Tensor],
    wrapper_bytes: int = 0,
) -> None:
    """Refuse a search on a CPU standing in for a device of ``capacity_bytes`` whose budget
    (``memory_fraction`` x it) is more than the host can give: the host's allocator would fail
    before the budget did, and the answer would be the machine's. ``held``: the tensors the
    workload holds already (inside the budget, and allocated), ``wrapper_bytes`` its wrapper's."""
    if not stands_in_on_host(device):
        return
    budget = int(memory_fraction * capacity_bytes)
    held_bytes = sum(each.untyped_storage().nbytes() for each in unique_storages(held)) + wrapper_bytes
    host = host_memory()
    room = host.available_bytes + held_bytes
    if budget <= room:
        return
    most_mib = int(room / memory_fraction) // MiB
    raise ConfigurationError(
        f"memory_limit={format_bytes(capacity_bytes)} at memory_fraction={memory_fraction:g} lets the "
        f"search's trials take {format_bytes(budget)}, but this host can give them {format_bytes(room)} "
        f"({host.describe()}, beside the {format_bytes(held_bytes)} the workload holds already): "
        f"past that the host's own allocator fails before the budget does, and the answer would be "
        f"this machine's, not a {format_bytes(capacity_bytes)} device's. Pass memory_limit='{most_mib}MiB' "
        f"or less, or run where more memory is free (a cgroup's limit and ulimit -v count too)."
    )


def host_ran_out(
    error: BaseException,
    device: Device,
    budget_bytes: int,
    host: HostMemory,
    batch_size: int,
    where: str,
) -> HostOutOfMemoryError | None:
    """The error a search stops with where ``error`` is the host's own allocator failing on a
    device whose budget is not the host's memory (``Device.host_is_capacity``), at ``batch_size``
    (``where``: in which step, or making its batch); ``host``: what the host could give the
    trials when they began. None for any other error, and on the CPU with no ``memory_limit``,
    where the host running out is the device running out."""
    if device.host_is_capacity or not is_host_out_of_memory(error):
        return None
    if stands_in_on_host(device):
        advice = (
            "Lower memory_limit or memory_fraction so that the budget sits well inside what the "
            "host can give, or run on a machine with more memory."
        )
    else:
        advice = "Free host memory (other processes, a cgroup's limit, ulimit -v), or use a larger machine."
    return HostOutOfMemoryError(
        f"the host ran out of memory at batch_size={batch_size} ({where}): {first_line(error)}. That "
        f"is this machine's own allocator failing, not the {format_bytes(budget_bytes)} budget on "
        f"{device.name}: the host could give the trials {format_bytes(host.available_bytes)} when they "
        f"began ({host.describe()}), and what a step takes outside the budget (its host batch, the "
        f"allocator's own overhead) comes from there too. The search stops, as an answer read from "
        f"this failure would be the machine's, not the budget's. {advice}",
        batch_size=batch_size,
        budget_bytes=budget_bytes,
        host_bytes=host.available_bytes,
    )

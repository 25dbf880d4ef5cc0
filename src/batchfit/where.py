"""Where a verb measures, resolved in one place: its ``where`` (a ``Where``), or the loose
``device``, ``memory_limit`` and ``memory_fraction`` of the one-line call, made into the device
found present (``ResolvedDevice``)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from batchfit.checks import check_option
from batchfit.errors import ConfigurationError
from batchfit.options import Where
from batchfit.runtime.devices.device import Device
from batchfit.runtime.devices.resolve import resolve_device


@dataclass(frozen=True)
class ResolvedDevice:
    """A ``Where`` resolved: the device, found present, and the share of it a batch may use."""

    device: Device
    memory_fraction: float

    @classmethod
    def of(cls, where: Where) -> ResolvedDevice:
        return cls(resolve_device(where.device, where.memory_limit_bytes), where.memory_fraction)


def where_of(
    verb: str,
    where: Where | None,
    device: str | torch.device | None = None,
    memory_limit: str | int | None = None,
    memory_fraction: float | None = None,
) -> Where:
    """``verb``'s ``where``, or the ``Where`` its loose keywords make; a ConfigurationError naming
    both where a keyword given beside ``where`` says otherwise."""
    check_option(verb, "where", where, Where, optional=True)
    loose: dict[str, object] = {
        "device": device,
        "memory_limit": memory_limit,
        "memory_fraction": memory_fraction,
    }
    given = {name: value for name, value in loose.items() if value is not None}
    if memory_fraction is None:  # Where's own default
        made = Where(device, memory_limit)
    else:
        made = Where(device, memory_limit, memory_fraction)
    if where is None:
        return made
    for name in given:
        if _meaning(made, name) != _meaning(where, name):
            raise ConfigurationError(
                f"{verb} was given where={where!r} and {name}={given[name]!r}, which disagree "
                f"(where.{name} is {getattr(where, name)!r}): pass one of them, "
                f"where=Where(..., {name}={given[name]!r}) or the keyword alone."
            )
    return where


def target_of(
    verb: str,
    where: Where | None,
    device: str | torch.device | None = None,
    memory_limit: str | int | None = None,
    memory_fraction: float | None = None,
) -> ResolvedDevice:
    """``where_of``'s ``Where``, resolved: the device found present (a ConfigurationError where it
    is not)."""
    return ResolvedDevice.of(where_of(verb, where, device, memory_limit, memory_fraction))


def _meaning(where: Where, name: str) -> object:
    """``where``'s ``name`` as it acts: the device as torch writes it, the capacity in bytes."""
    if name == "device":
        return None if where.device is None else str(where.device)
    return where.memory_limit_bytes if name == "memory_limit" else getattr(where, name)

"""Where a verb measures, resolved in one place: its ``where`` (a ``Where``), or the loose
``device``, ``memory_limit`` and ``memory_fraction`` of the one-line call, made into the device
found present (``ResolvedDevice``). The shorthand is typed (``WhereShorthand``, PEP 692's
``**shorthand: Unpack[WhereShorthand]``), so a type checker checks its names and values too."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypedDict

import torch

from batchfit.checks import check_option
from batchfit.errors import ArgumentTypeError, ConfigurationError
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


class DeviceShorthand(TypedDict, total=False):
    """The one-line call's shorthand for ``where`` where a verb needs the device alone."""

    device: str | torch.device | None


class CapacityShorthand(DeviceShorthand, total=False):
    """The shorthand for ``where``'s device and capacity (a verb that sweeps its own fractions)."""

    memory_limit: str | int | None


class WhereShorthand(CapacityShorthand, total=False):
    """The one-line call's shorthand for ``where``: ``Where``'s fields as loose keywords
    (``find_batch_size(workload, device="cpu", memory_limit="2GiB")``); None is ``Where``'s default."""

    memory_fraction: float | None


def where_of(
    verb: str,
    where: Where | None,
    shorthand: Mapping[str, object],
    accepts: frozenset[str] = WhereShorthand.__optional_keys__,
) -> Where:
    """``verb``'s ``where``, or the ``Where`` its ``shorthand`` keywords make (those ``accepts``
    names, a shorthand ``TypedDict``'s keys; another is an ArgumentTypeError naming it); a
    ConfigurationError naming both where a keyword given beside ``where`` says otherwise."""
    check_option(verb, "where", where, Where, optional=True)
    _check_names(verb, shorthand, accepts)
    given = {name: value for name, value in shorthand.items() if value is not None}
    made = Where(**given)  # type: ignore[arg-type]  # the names are checked, the values by Where
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
    shorthand: Mapping[str, object],
    accepts: frozenset[str] = WhereShorthand.__optional_keys__,
) -> ResolvedDevice:
    """``where_of``'s ``Where``, resolved: the device found present (a ConfigurationError where it
    is not)."""
    return ResolvedDevice.of(where_of(verb, where, shorthand, accepts))


def _check_names(verb: str, shorthand: Mapping[str, object], accepts: frozenset[str]) -> None:
    """An ArgumentTypeError naming a keyword ``verb`` has neither as a parameter nor in ``accepts``."""
    known = [name for name in Where.__dataclass_fields__ if name in accepts]  # in Where's order
    for name in shorthand:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f" (did you mean {close[0]}=?)" if close else ""
            raise ArgumentTypeError(
                f"{verb}() got an unexpected keyword argument {name!r}{hint}: besides its own "
                f"parameters (help(batchfit.{verb})) it takes {', '.join(f'{k}=' for k in known)} as "
                f"shorthand for where=batchfit.Where(...)."
            )


def _meaning(where: Where, name: str) -> object:
    """``where``'s ``name`` as it acts: the device as torch writes it, the capacity in bytes."""
    if name == "device":
        return None if where.device is None else str(where.device)
    return where.memory_limit_bytes if name == "memory_limit" else getattr(where, name)

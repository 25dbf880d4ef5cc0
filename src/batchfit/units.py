"""Byte quantities: parse "2GiB" / "1.5 GB" / "512MiB" / "1000000", and print them back."""

from __future__ import annotations

import re

from batchfit.errors import ConfigurationError

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}
_PATTERN = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*$")


def parse_bytes(value: str | int | float, *, name: str = "memory_limit") -> int:
    """Return a byte count from an int or a string such as ``"2GiB"``, ``"1.5GB"`` or ``"800MiB"``."""
    if isinstance(value, bool):
        raise ConfigurationError(f"{name} must be a size such as '2GiB', got {value!r}.")
    if isinstance(value, (int, float)):
        number, unit = float(value), ""
    else:
        match = _PATTERN.match(str(value))
        if match is None or match.group(2).lower() not in _UNITS:
            raise ConfigurationError(
                f"{name}={value!r} is not a size: write a number with an optional unit, "
                f"such as '2GiB', '1.5GB', '800MiB' or '1000000' (bytes)."
            )
        number, unit = float(match.group(1)), match.group(2).lower()
    size = int(number * _UNITS[unit])
    if size <= 0:
        raise ConfigurationError(f"{name}={value!r} must be a positive size, such as '2GiB'.")
    return size


def format_bytes(size: int | float) -> str:
    """Render a byte count with a binary unit, e.g. ``1.50 GiB``."""
    magnitude = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(magnitude) < 1024 or unit == "GiB":
            return f"{int(magnitude)} B" if unit == "B" else f"{magnitude:.2f} {unit}"
        magnitude /= 1024
    raise AssertionError("unreachable")


def format_count(count: int, noun: str) -> str:
    """``count`` and ``noun``, plural unless it is one: "1 trial", "3 trials"."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"

"""Byte quantities: parse "2GiB" / "1.5 GB" / "512MiB" / "1000000", and print them back.

One rule for every size batchfit reads: an SI unit is decimal (kB, MB, GB, TB: powers of 1000), an
IEC unit is binary (KiB, MiB, GiB, TiB, or Ki, Mi, Gi, Ti: powers of 1024), a bare number is bytes,
letter case aside; a prefix alone ("64M") could be either, and is refused with both readings."""

from __future__ import annotations

import re

from batchfit.errors import ConfigurationError

_PREFIXES = ("k", "m", "g", "t")
_UNITS = {
    "": 1,
    "b": 1,
    **{f"{prefix}b": 1000**power for power, prefix in enumerate(_PREFIXES, start=1)},
    **{f"{prefix}ib": 1024**power for power, prefix in enumerate(_PREFIXES, start=1)},
    **{f"{prefix}i": 1024**power for power, prefix in enumerate(_PREFIXES, start=1)},
}
_PATTERN = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*$")
#: What every refusal shows as sizes that read.
_EXAMPLES = "such as '2GiB' (2 x 1024^3 bytes), '1.5GB' (1.5 x 1000^3), '800MiB' or '1000000' (bytes)"


def parse_bytes(value: str | int | float, *, name: str = "memory_limit") -> int:
    """Return a byte count from an int or a string such as ``"2GiB"``, ``"1.5GB"`` or ``"800MiB"``:
    SI units decimal, IEC units binary; a bare prefix (``"64M"``) is refused, naming both readings."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ConfigurationError(
            f"{name} must be a size, a str {_EXAMPLES}, or a byte count (an int), "
            f"got {type(value).__name__} {value!r}."
        )
    if isinstance(value, (int, float)):
        number, unit = float(value), ""
    else:
        match = _PATTERN.match(value)
        if match is None:
            raise ConfigurationError(
                f"{name}={value!r} is not a size: write a number and a unit, {_EXAMPLES}."
            )
        number, unit = float(match.group(1)), match.group(2).lower()
        if unit in _PREFIXES:
            raise ConfigurationError(_ambiguous(name, value, match.group(1), match.group(2)))
        if unit not in _UNITS:
            raise ConfigurationError(
                f"{name}={value!r} has no unit batchfit reads ({match.group(2)!r}): write a number "
                f"and a unit, {_EXAMPLES}."
            )
    size = int(number * _UNITS[unit])
    if size <= 0:
        raise ConfigurationError(f"{name}={value!r} must be a positive size, such as '2GiB'.")
    return size


def _ambiguous(name: str, value: str, number: str, prefix: str) -> str:
    """The refusal of a bare prefix, with the bytes of its decimal and its binary reading."""
    decimal, binary = (int(float(number) * _UNITS[prefix.lower() + unit]) for unit in ("b", "ib"))
    upper = prefix.upper() if prefix.lower() != "k" else "k"
    return (
        f"{name}={value!r} is ambiguous: write {number}{upper}B for {decimal:,} bytes (decimal) "
        f"or {number}{prefix.upper()}iB for {binary:,} bytes (binary)."
    )


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

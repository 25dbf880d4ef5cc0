"""Byte sizes given by users."""

from __future__ import annotations

import pytest

from batchfit.errors import ConfigurationError
from batchfit.units import format_bytes, format_count, parse_bytes


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2GiB", 2 * 1024**3),
        ("1.5 GB", 1_500_000_000),
        ("800MiB", 800 * 1024**2),
        ("1000000", 10**6),
        (4096, 4096),
        ("64kib", 65536),
        ("3g", 3 * 10**9),
    ],
)
def test_parse(text: str | int, expected: int) -> None:
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["lots", "2 GiBs", "-1GiB", "", "GiB"])
def test_unparsable(text: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        parse_bytes(text)
    assert str(info.value) == (
        f"memory_limit={text!r} is not a size: write a number with an optional unit, "
        "such as '2GiB', '1.5GB', '800MiB' or '1000000' (bytes)."
    )


def test_zero_is_not_a_size() -> None:
    with pytest.raises(ConfigurationError, match=r"memory_limit='0GiB' must be a positive size"):
        parse_bytes("0GiB")


def test_format() -> None:
    assert [format_bytes(v) for v in (512, 2048, 3 * 1024**2, 5 * 1024**3)] == [
        "512 B",
        "2.00 KiB",
        "3.00 MiB",
        "5.00 GiB",
    ]


def test_format_count() -> None:
    assert [format_count(n, "trial") for n in (0, 1, 2)] == ["0 trials", "1 trial", "2 trials"]

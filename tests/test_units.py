"""Byte sizes given by users: one rule (SI units decimal, IEC units binary, a bare prefix refused)."""

from __future__ import annotations

import pytest

from batchfit import Where
from batchfit.errors import ConfigurationError
from batchfit.units import format_bytes, format_count, parse_bytes

EXAMPLES = "such as '2GiB' (2 x 1024^3 bytes), '1.5GB' (1.5 x 1000^3), '800MiB' or '1000000' (bytes)"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("64MB", 64_000_000),
        ("64MiB", 67_108_864),
        ("64Mi", 67_108_864),
        ("64mb", 64_000_000),
        ("64mib", 67_108_864),
        ("64 kB", 64_000),
        ("64KB", 64_000),
        ("64KiB", 65_536),
        ("64Ki", 65_536),
        ("2GiB", 2_147_483_648),
        ("2Gi", 2_147_483_648),
        ("1.5 GB", 1_500_000_000),
        ("1.5GiB", 1_610_612_736),
        ("1TB", 10**12),
        ("1TiB", 2**40),
        ("800MiB", 838_860_800),
        ("1000000", 1_000_000),
        ("512B", 512),
        (" 3 GB ", 3_000_000_000),
        (4096, 4096),
        (1.5e9, 1_500_000_000),
    ],
)
def test_parse(text: str | int | float, expected: int) -> None:
    assert parse_bytes(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "64M",
            (
                "memory_limit='64M' is ambiguous: write 64MB for 64,000,000 bytes (decimal) or 64MiB for "
                "67,108,864 bytes (binary)."
            ),
        ),
        (
            "64m",
            (
                "memory_limit='64m' is ambiguous: write 64MB for 64,000,000 bytes (decimal) or 64MiB for "
                "67,108,864 bytes (binary)."
            ),
        ),
        (
            "1.5G",
            (
                "memory_limit='1.5G' is ambiguous: write 1.5GB for 1,500,000,000 bytes (decimal) or 1.5GiB "
                "for 1,610,612,736 bytes (binary)."
            ),
        ),
        (
            "512k",
            (
                "memory_limit='512k' is ambiguous: write 512kB for 512,000 bytes (decimal) or 512KiB for "
                "524,288 bytes (binary)."
            ),
        ),
        (
            "2T",
            (
                "memory_limit='2T' is ambiguous: write 2TB for 2,000,000,000,000 bytes (decimal) or 2TiB for "
                "2,199,023,255,552 bytes (binary)."
            ),
        ),
        (
            "2 GiBs",
            (
                f"memory_limit='2 GiBs' has no unit batchfit reads ('GiBs'): write a number and a unit, "
                f"{EXAMPLES}."
            ),
        ),
        ("64Mb2", f"memory_limit='64Mb2' is not a size: write a number and a unit, {EXAMPLES}."),
        ("lots", f"memory_limit='lots' is not a size: write a number and a unit, {EXAMPLES}."),
        ("-1GiB", f"memory_limit='-1GiB' is not a size: write a number and a unit, {EXAMPLES}."),
        ("", f"memory_limit='' is not a size: write a number and a unit, {EXAMPLES}."),
        ("GiB", f"memory_limit='GiB' is not a size: write a number and a unit, {EXAMPLES}."),
        ("0GiB", "memory_limit='0GiB' must be a positive size, such as '2GiB'."),
        (0, "memory_limit=0 must be a positive size, such as '2GiB'."),
        (
            True,
            f"memory_limit must be a size, a str {EXAMPLES}, or a byte count (an int), got bool True.",
        ),
        (
            [64],
            f"memory_limit must be a size, a str {EXAMPLES}, or a byte count (an int), got list [64].",
        ),
    ],
)
def test_refused(text: object, message: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        parse_bytes(text)  # type: ignore[arg-type]
    assert str(info.value) == message


def test_the_options_and_the_flag_read_sizes_by_the_same_rule() -> None:
    assert Where(memory_limit="64MB").memory_limit_bytes == 64_000_000
    assert Where(memory_limit="64MiB").memory_limit_bytes == 64 * 2**20
    with pytest.raises(ConfigurationError, match=r"^memory_limit='64M' is ambiguous: write 64MB for "):
        Where(memory_limit="64M")


def test_format() -> None:
    assert [format_bytes(v) for v in (512, 2048, 3 * 1024**2, 5 * 1024**3)] == [
        "512 B",
        "2.00 KiB",
        "3.00 MiB",
        "5.00 GiB",
    ]


def test_format_count() -> None:
    assert [format_count(n, "trial") for n in (0, 1, 2)] == ["0 trials", "1 trial", "2 trials"]

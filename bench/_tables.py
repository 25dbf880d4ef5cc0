"""Table printing shared by the benchmarks: aligned text, and Markdown for the README."""

from __future__ import annotations

from collections.abc import Collection, Sequence


def print_text_table(headers: Sequence[str], lines: list[list[str]]) -> None:
    cells = [list(headers), *lines]
    widths = [max(len(line[i]) for line in cells) for i in range(len(headers))]
    for index, line in enumerate(cells):
        print("  ".join(cell.rjust(width) for cell, width in zip(line, widths, strict=True)))
        if index == 0:
            print("  ".join("-" * width for width in widths))


def print_markdown_table(
    headers: Sequence[str], lines: list[list[str]], text_columns: Collection[int]
) -> None:
    """Columns in ``text_columns`` are left-aligned, the others (numbers) right-aligned."""
    print("| " + " | ".join(headers) + " |")
    print("|" + "|".join("---" if i in text_columns else "---:" for i in range(len(headers))) + "|")
    for line in lines:
        print("| " + " | ".join(line) + " |")

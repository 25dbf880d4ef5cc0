"""What the benchmarks share: a stopwatch, aligned text tables, and Markdown for the README."""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence


class Stopwatch:
    """Wall-clock (``time.perf_counter``) and process CPU seconds of a block."""

    def __enter__(self) -> Stopwatch:
        self._wall, self._cpu = time.perf_counter(), time.process_time()
        self.seconds = self.cpu_seconds = 0.0
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self._wall
        self.cpu_seconds = time.process_time() - self._cpu


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

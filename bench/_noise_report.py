"""What ``bench/noise_prediction.py`` prints: each batch size's steps to the target beside the fitted
S(B), and the fit's, B_simple's and their ratio's lines with their bootstrap intervals."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from _harness import print_markdown_table, print_text_table


def fitted(found: dict[str, float], batch_size: int) -> float:
    return found["s_min"] * (1 + found["b_crit"] / batch_size)


def report(rows: list[dict[str, Any]], found: dict[str, float], intervals: dict[str, list[float]]) -> None:
    """Each batch size's row as text and as Markdown, then the summary's lines."""
    headers = ["batch", "lr", "steps (median)", "steps (min-max)", "fitted S(B)"]
    lines = [
        [
            str(row["batch_size"]),
            f"{row['learning_rate']:g}",
            f"{row['median_steps']:.0f}",
            spread(row["steps"]),
            f"{fitted(found, row['batch_size']):.0f}",
        ]
        for row in rows
    ]
    print_text_table(headers, lines)
    print()
    print_markdown_table(headers, lines, ())
    print()
    for line in summary_lines(found, intervals):
        print(line)


def spread(steps: Sequence[int | None]) -> str:
    values = [math.inf if value is None else value for value in steps]
    return f"{min(values):.0f}-{max(values):.0f}"


def summary_lines(found: dict[str, float], intervals: dict[str, list[float]]) -> list[str]:
    def interval(name: str, digits: str = ".0f") -> str:
        low, high = intervals[name]
        return f"(90%: {low:{digits}}-{high:{digits}})"

    ratios = ", ".join(
        f"{where} {found['b_crit'] / found[f'b_simple_{name}']:.2f} {interval(f'ratio_{name}', '.2f')}"
        for name, where in (("start", "at the start"), ("run", "over the run"))
    )
    early = found["b_crit"] / found["b_simple_early"]
    fitted = f"S_min = {found['s_min']:.0f} {interval('s_min')}, B_crit = {found['b_crit']:.0f} "
    scales = (
        f"B_simple: {found['b_simple_start']:.0f} at the start {interval('b_simple_start')}, "
        f"{found['b_simple_early']:.0f} early {interval('b_simple_early')}, "
        f"{found['b_simple_run']:.0f} over the run {interval('b_simple_run')}"
    )
    return [
        fitted + interval("b_crit"),
        scales,
        f"B_crit / B_simple early = {early:.2f} {interval('ratio_early', '.2f')}; {ratios}",
    ]

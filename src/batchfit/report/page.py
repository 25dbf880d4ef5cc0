"""The report's HTML page: what ran, then one section per saved result with its plots inline.
One file, no script, no external URL: it opens offline and prints."""

from __future__ import annotations

import datetime
import html
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import batchfit
from batchfit.report import plots
from batchfit.report.results import Kind, SavedResult

_STYLE = """
body { font-family: sans-serif; max-width: 1200px; margin: 1em auto; padding: 0 1em; color: #111; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; border-bottom: 1px solid #999; }
table.what-ran td { padding: 0 1em 0 0; } table.what-ran td:first-child { color: #555; }
figure { margin: 1em 0; } svg { max-width: 100%; height: auto; }
@media print { body { max-width: none; } section { break-inside: avoid; } a { color: inherit; } }
"""


def render_report(results: Sequence[SavedResult], *, created_at: str | None = None) -> str:
    """The HTML page for ``results``, one section each, in order."""
    plots.require_matplotlib()
    created_at = created_at or datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    sections = [_section(result, index) for index, result in enumerate(results)]
    plural = "s" if len(results) != 1 else ""
    rendered = (
        f"<p>Rendered {html.escape(created_at)} by batchfit {html.escape(batchfit.__version__)} "
        f"from {len(results)} saved result{plural}.</p></header>"
    )
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en">',
            '<head><meta charset="utf-8"><title>batchfit report</title>',
            f"<style>{_STYLE}</style></head>",
            "<body>",
            "<header><h1>batchfit report</h1>",
            rendered,
            *sections,
            "</body></html>",
            "",
        ]
    )


def write_report(results: Sequence[SavedResult], path: str | Path) -> None:
    """Write the page to ``path``, saying so on stderr."""
    Path(path).write_text(render_report(results))
    print(f"batchfit: wrote report {path}", file=sys.stderr)


def _section(result: SavedResult, index: int) -> str:
    rows = "".join(
        f'<tr><td>{html.escape(name)}</td><td class="{html.escape(name)}">{html.escape(value)}</td></tr>'
        for name, value in result.what_ran.rows()
    )
    figures = "".join(
        f'<figure class="{html.escape(result.kind)}">{svg}'
        f"<figcaption>{html.escape(caption)}</figcaption></figure>"
        for caption, svg in _FIGURES[result.kind](result, f"batchfit-{index}")
    )
    return (
        f'<section class="result {html.escape(result.kind)}">'
        f"<h2>batchfit {html.escape(result.kind)}: {html.escape(result.source)}</h2>"
        f'<table class="what-ran">{rows}</table>{figures}</section>'
    )


def _find(result: SavedResult, salt: str) -> list[tuple[str, str]]:
    caption = (
        "Peak memory against batch size: each real trial (ok, over budget, oom), the forecast traces, "
        "the fitted memory lines, the budget, the capacity and the answer."
    )
    return [(caption, plots.find_figure(result.document["results"], salt))]


def _plan(result: SavedResult, salt: str) -> list[tuple[str, str]]:
    caption = (
        "The learning rate over optimizer steps: linear warm-up to the scaled rate, then constant; "
        "the cosine and linear decays of warmup_schedule are drawn for comparison."
    )
    return [(caption, plots.plan_figure(result.document, salt))]


def _explore(result: SavedResult, salt: str) -> list[tuple[str, str]]:
    caption = (
        "Throughput against batch size (log x): each estimate with its windows' range, the tolerance band "
        "under the best and the recommendation; beside it, the live recommendation and its confidence."
    )
    return [(caption, plots.explore_figure(result.document, salt))]


_FIGURES: dict[Kind, Callable[[SavedResult, str], list[tuple[str, str]]]] = {
    "find": _find,
    "plan": _plan,
    "explore": _explore,
}

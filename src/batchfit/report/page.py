"""The report's HTML page: what ran, then one section per saved result with its plots inline.
One file, no script, no external URL: it opens offline and prints."""

from __future__ import annotations

import datetime
import html
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import batchfit
from batchfit.policy.explore.advice import Change
from batchfit.report import canvas, change_plots, goodput_plots, noise_plots, plots, prediction_plots
from batchfit.report.results import Kind, SavedResult

_STYLE = """
body { font-family: sans-serif; max-width: 1200px; margin: 1em auto; padding: 0 1em; color: #111; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; border-bottom: 1px solid #999; }
table.what-ran td { padding: 0 1em 0 0; } table.what-ran td:first-child { color: #555; }
figure { margin: 1em 0; } h3 { font-size: 1em; } svg { max-width: 100%; height: auto; }
@media print { body { max-width: none; margin: 0; padding: 0; } figure { break-inside: avoid; } }
"""


def render_report(results: Sequence[SavedResult], *, created_at: str | None = None) -> str:
    """The HTML page for ``results``, one section each, in order."""
    canvas.require_matplotlib()
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
    parts = "".join(_PARTS[result.kind](result.document, f"batchfit-{index}"))
    return (
        f'<section class="result {html.escape(result.kind)}">'
        f"<h2>batchfit {html.escape(result.kind)}: {html.escape(result.source)}</h2>"
        f'<table class="what-ran">{rows}</table>{parts}</section>'
    )


def _figure(kind: str, caption: str, svg: str) -> str:
    return f'<figure class="{kind}">{svg}<figcaption>{html.escape(caption)}</figcaption></figure>'


def _list(kind: str, heading: str, items: Sequence[str]) -> str:
    lines = "".join(f"<li>{html.escape(item)}</li>" for item in items)
    return f'<div class="{kind}"><h3>{html.escape(heading)}</h3><ul>{lines}</ul></div>' if items else ""


def _find(document: Mapping[str, Any], salt: str) -> list[str]:
    caption = (
        "Peak memory against batch size: each real trial (ok, over budget, oom), the forecast traces, "
        "the fitted memory lines, the budget, the capacity and the answer."
    )
    return [_figure("find", caption, plots.find_figure(document["results"], salt))]


def _plan(document: Mapping[str, Any], salt: str) -> list[str]:
    caption = (
        "The learning rate over optimizer steps: linear warm-up to the scaled rate, then constant; "
        "the cosine and linear decays of warmup_schedule are drawn for comparison."
    )
    return [_figure("plan", caption, plots.plan_figure(document, salt))]


def _explore(document: Mapping[str, Any], salt: str) -> list[str]:
    caption = (
        "Throughput against batch size (log x): each estimate with its windows' range, the tolerance band "
        "under the best and the recommendation; beside it, the live recommendation and its confidence."
    )
    parts = [_figure("explore", caption, plots.explore_figure(document, salt))]
    goodput = document.get("goodput")  # an exploration given a noise scale
    if goodput is not None:
        caption = (
            "Goodput at the noise scale: throughput and goodput (throughput x statistical efficiency) "
            "against batch size, the time-optimal, fastest and largest measured batches marked; beside "
            "it, each batch's statistical efficiency, the noise scale and the sample tolerance."
        )
        parts.append(_figure("goodput", caption, goodput_plots.goodput_figure(goodput, f"{salt}-goodput")))
        parts.append(_list("goodput-notes", "To a target, at the noise scale", goodput["lines"]))
    return parts


def _analyze(document: Mapping[str, Any], salt: str) -> list[str]:
    caption = "The largest memory-safe batch at each memory fraction, per mode (train, eval)."
    return [_figure("analyze", caption, plots.analyze_figure(document["rows"], salt))]


def _compare(document: Mapping[str, Any], salt: str) -> list[str]:
    caption = (
        "Each technique against the baseline (dashed): its largest memory-safe batch and the throughput "
        "at that batch, with the ratio to the baseline's."
    )
    notes = [
        f"{row['technique']}: {'' if row['applied'] else 'cannot apply: '}{row['note']}"
        for row in document["rows"]
    ]
    return [
        _figure("compare", caption, change_plots.compare_figure(document, salt)),
        _list("compare-notes", "How each technique applied, or why it could not", notes),
    ]


def _check_data(document: Mapping[str, Any], salt: str) -> list[str]:
    caption = (
        "Each DataLoader setting measured (the current one first): the share of each step spent waiting "
        "for data, and the samples/s of training with it, against the loader alone and the step alone."
    )
    return [
        _figure("check-data", caption, change_plots.data_figure(document, salt)),
        _list("check-data-notes", "Verdict", [document["summary"], *document["notes"]]),
    ]


def _noise_scale(document: Mapping[str, Any], salt: str) -> list[str]:
    caption = (
        "The noise scale's readings, one per optimizer step: the estimates of |G|^2 (the true "
        "gradient's squared norm) and tr(Sigma) (the per-example gradients' variance) with their means "
        "so far, and B_simple = tr(Sigma) / |G|^2 over the steps so far with its 90% interval."
    )
    scale = document["noise_scale"]
    weights = "fixed weights" if document["fixed_weights"] else "training"
    small = scale["small_batch_size"]
    facts = [
        f"B_simple {scale['b_simple']:.4g}" if scale["resolved"] else "B_simple not resolved",
        f"from {scale['steps']} steps ({weights}), batch {scale['big_batch_size']} against {small}",
        f"meaning: {scale['meaning']}",
    ]
    return [
        _figure("noise-scale", caption, noise_plots.noise_scale_figure(document, salt)),
        _list("noise-scale-notes", "What it says", facts),
    ]


def _noise_prediction(document: Mapping[str, Any], salt: str) -> list[str]:
    caption = (
        "The median steps to the target per batch size (the bar: their range over the seeds) against "
        "the fitted S(B) = S_min (1 + B_crit / B), with B_crit and the early B_simple marked; beside it, "
        "B_simple at each checkpoint of the largest batch's runs against B_crit."
    )
    return [
        _figure("noise-prediction", caption, noise_plots.prediction_figure(document, salt)),
        _list("noise-prediction-notes", "The fit and the ratio", document["lines"]),
    ]


def _predict(document: Mapping[str, Any], salt: str) -> list[str]:
    """The answers by capacity, then what the prediction models and what it does not."""
    prediction = document["prediction"]
    caption = (
        "The largest batch predicted at each target's capacity, train and eval, each with its band "
        "(the card's and the context's ranges, the unmodelled parts, the smaller pair's replay); "
        "the trials recorded at the recording capacity, where that was a GPU's, as measured points."
    )
    unmodelled = [
        f"{part['part']}: {part['share']:.0%} of the budget either way"
        + ("" if part.get("measured") else " (a guess)")
        for part in prediction["unmodelled"]
    ]
    return [
        _figure("predict", caption, prediction_plots.prediction_figure(prediction, salt)),
        _list("predict-modelled", "Modelled", prediction["modelled"]),
        _list("predict-unmodelled", "Not modelled, each widening the band", unmodelled),
    ]


def _advise(document: Mapping[str, Any], salt: str) -> list[str]:
    """What to change, then each step's own plots, as its command's report draws them."""
    context = document.get("context", "")
    changes = [_change_line(change, context) for change in document["changes"]]
    changes = changes or ["nothing measured is worth it"]
    costly = [_change_line(change, context) for change in document["memory_only"]]
    parts = [
        _list(
            "advise-changes", "What to change, by measured gain", changes or ["nothing measured was worth it"]
        ),
        _list("advise-memory-only", "A larger batch at a cost in speed", costly),
        _list("advise-skipped", "Steps skipped", document["skipped"]),
    ]
    searches = [document[mode] for mode in ("train", "eval") if document[mode] is not None]
    if searches:
        parts += _find({"results": searches}, f"{salt}-find")
    steps: tuple[tuple[str, Callable[[Mapping[str, Any], str], list[str]]], ...] = (
        ("exploration", _explore),
        ("comparison", _compare),
        ("data", _check_data),
        ("plan", _plan),
    )
    for key, draw in steps:
        if document[key] is not None:
            parts += draw(document[key], f"{salt}-{key}")
    return parts


def _change_line(change: Mapping[str, Any], context: str) -> str:
    """A change as advise's text report words it."""
    return Change(**change).line(context)


_PARTS: dict[Kind, Callable[[Mapping[str, Any], str], list[str]]] = {
    "find": _find,
    "plan": _plan,
    "explore": _explore,
    "analyze": _analyze,
    "compare": _compare,
    "check-data": _check_data,
    "advise": _advise,
    "noise-scale": _noise_scale,
    "noise-prediction": _noise_prediction,
    "predict": _predict,
}

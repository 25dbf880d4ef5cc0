"""The plot of a ``predict`` result: the largest batch predicted against each target's capacity,
train and eval, with the band, and the trials measured where the requests were recorded."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from batchfit.errors import ConfigurationError
from batchfit.report.canvas import new_figure, to_svg
from batchfit.units import parse_bytes

if TYPE_CHECKING:
    from matplotlib.axes import Axes

MODE_COLOUR = {"train": "tab:blue", "eval": "tab:orange"}


def prediction_figure(prediction: Mapping[str, Any], salt: str) -> str:
    """Batch size against capacity (log x): each mode's answers joined by a line, its band as an
    error bar, each answer labelled ("512+" where the largest candidate was placed); the recorded
    trials at the capacity they ran under, where that is a GPU's (not the CPU standing in alone)."""
    figure = new_figure(2, height=4.6)  # one plot, its legend on its right
    axes = figure.subplots()
    rows = sorted(prediction["rows"], key=lambda row: row["total_bytes"])
    for mode, colour in MODE_COLOUR.items():
        _mode_line(axes, rows, mode, colour)
    _recorded_points(axes, prediction)
    recorded = _recorded_capacity(prediction)
    totals = sorted({row["total_bytes"] for row in rows} | recorded)
    labels = [
        _capacity_label(total, rows) + ("\n(recorded)" if total in recorded else "") for total in totals
    ]
    axes.set_xscale("log", base=2)
    axes.set_xticks(totals, labels, fontsize="small", rotation=30, ha="right")
    axes.minorticks_off()
    if len(totals) == 1:
        axes.set_xlim(totals[0] / 1.5, totals[0] * 1.5)
    axes.set_ylim(0, axes.get_ylim()[1] * 1.1)  # room above the top answer for its label
    axes.set_title("largest batch predicted by capacity")
    axes.set_xlabel("capacity (the card's total memory)")
    axes.set_ylabel("batch size")
    axes.legend(fontsize="small", loc="center left", bbox_to_anchor=(1.02, 0.5), frameon=False)
    return to_svg(figure, salt)


def _mode_line(axes: Axes, rows: list[Mapping[str, Any]], mode: str, colour: str) -> None:
    """One mode's answers and their bands; targets where nothing is placed are left out."""
    points = [(row["total_bytes"], row[mode]) for row in rows if row.get(mode) and row[mode]["batch_size"]]
    if not points:
        return
    totals = [total for total, _ in points]
    answers = [each["batch_size"] for _, each in points]
    low = [answer - (each["band"][0] or 0) for answer, (_, each) in zip(answers, points, strict=True)]
    high = [(each["band"][1] or answer) - answer for answer, (_, each) in zip(answers, points, strict=True)]
    axes.errorbar(
        totals,
        answers,
        yerr=[low, high],
        marker="o",
        color=colour,
        capsize=4,
        label=f"{mode}: predicted, with its band",
    )
    for total, answer, (_, each) in zip(totals, answers, points, strict=True):
        axes.annotate(
            f"{answer}+" if each["at_max_batch_size"] else f"{answer}",
            (total, answer),
            textcoords="offset points",
            xytext=(6, 4),
            fontsize="small",
            color=colour,
        )


def _recorded_capacity(prediction: Mapping[str, Any]) -> set[int]:
    capacity = prediction.get("recorded_capacity_bytes")
    return set() if capacity is None or prediction.get("cpu_alone") else {capacity}


def _recorded_points(axes: Axes, prediction: Mapping[str, Any]) -> None:
    """The trials the requests were recorded from, measured at the recording capacity: each mode's
    that fitted (filled) and that did not (a cross)."""
    (capacity,) = _recorded_capacity(prediction) or (None,)
    if capacity is None:
        return
    for mode, trials in prediction["recorded_trials"].items():
        colour = MODE_COLOUR.get(mode, "tab:gray")
        for fitted in (True, False):
            sizes = [trial["batch_size"] for trial in trials if (trial["outcome"] == "ok") == fitted]
            if sizes:
                said = "fitted" if fitted else "failed"
                axes.scatter(
                    [capacity] * len(sizes),
                    sizes,
                    marker="s" if fitted else "x",
                    color=colour,
                    alpha=0.6,
                    label=f"{mode}: recorded trial, {said}",
                )


def _capacity_label(total: int, rows: list[Mapping[str, Any]]) -> str:
    """A tick's label: the size, under the cards at that total (a capacity given as a size is
    named by the size alone)."""
    cards = [row["target"] for row in rows if row["total_bytes"] == total and not _is_size(row["target"])]
    size = _short(total)
    return f"{'/'.join(cards)}\n{size}" if cards else size


def _is_size(name: str) -> bool:
    try:
        parse_bytes(name, name="capacities")
    except ConfigurationError:
        return False
    return True


def _short(total: int) -> str:
    """A size to three figures in its largest binary unit: 42 MiB, 79.1 GiB."""
    unit = next(unit for unit in ("TiB", "GiB", "MiB", "KiB", "B") if total >= _UNITS[unit] or unit == "B")
    return f"{total / _UNITS[unit]:.3g} {unit}"


_UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}

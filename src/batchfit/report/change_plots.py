"""The plots of what to change: compare's techniques against the baseline (largest batch and
throughput) and check-data's loader settings (where each step's time goes, and samples/s)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from batchfit.policy.explore.loader_settings import LoaderSetting
from batchfit.report.canvas import legend_below, new_figure, to_svg

if TYPE_CHECKING:
    from matplotlib.axes import Axes

_HEADROOM = 1.45  # of the longest bar: room on its right for the labels
_BAR = "tab:blue"
_MARKED = "tab:green"  # the recommended setting
_MUTED = "#bbbbbb"


def batch_label(row: Mapping[str, Any]) -> str:
    """A technique's largest batch as compare's table writes it (">=" a lower bound, "xN" accumulated)."""
    batch = (">=" if row["at_max_batch_size"] else "") + str(row["batch_size"])
    return batch + (f"x{row['accumulation_steps']}" if row["accumulation_steps"] else "")


def ratio_label(ratio: float | None) -> str:
    return "" if ratio is None else f" ({ratio:.2f}x)"


def compare_figure(comparison: Mapping[str, Any], salt: str) -> str:
    """Per technique, top to bottom as compared: the largest memory-safe batch and the throughput at
    it, each labelled with its number and its ratio to the baseline (the dashed line)."""
    rows = comparison["rows"]
    unit = comparison["unit"]
    measured = [row["applied"] and row["batch_size"] is not None for row in rows]
    figure = new_figure(2)
    batches, speeds = figure.subplots(1, 2, sharey=True)
    labels = [
        batch_label(row) + ratio_label(row["batch_ratio"]) if ok else "cannot apply (see below)"
        for row, ok in zip(rows, measured, strict=True)
    ]
    _bars(batches, [row["batch_size"] if ok else 0 for row, ok in zip(rows, measured, strict=True)], labels)
    throughputs = [row["samples_per_second"] if ok else None for row, ok in zip(rows, measured, strict=True)]
    labels = [
        "not measured" if value is None else f"{value:.1f}" + ratio_label(row["throughput_ratio"])
        for row, value in zip(rows, throughputs, strict=True)
    ]
    _bars(speeds, [value or 0 for value in throughputs], labels)
    baseline = rows[0] if rows and rows[0]["technique"] == "baseline" and measured[0] else None
    if baseline is not None:
        batches.axvline(baseline["batch_size"], color="black", linestyle="--", linewidth=0.8)
        if baseline["samples_per_second"] is not None:
            speeds.axvline(baseline["samples_per_second"], color="black", linestyle="--", linewidth=0.8)
    batches.set_yticks(range(len(rows)), [row["technique"] for row in rows])
    batches.invert_yaxis()  # the baseline on top, as in the table
    batches.set_title(f"largest memory-safe batch (memory_fraction {comparison['memory_fraction']:g})")
    batches.set_xlabel("batch size")
    speeds.set_title(f"{unit} at that batch")
    speeds.set_xlabel(unit)
    return to_svg(figure, salt)


def data_figure(check: Mapping[str, Any], salt: str) -> str:
    """Per loader setting (the current first): the share of each step spent waiting for data, and
    the samples/s of training with it, against the loader alone and the step alone."""
    settings = check["settings"]
    recommended = check["recommendation"]
    chosen = None if recommended is None else LoaderSetting(**recommended["setting"])
    names, colours = [], []
    for index, row in enumerate(settings):
        setting = LoaderSetting(**{key: row[key] for key in LoaderSetting.__dataclass_fields__})
        marks = (["current"] if index == 0 else []) + (["recommended"] if setting == chosen else [])
        names.append(setting.describe() + (f" ({', '.join(marks)})" if marks else ""))
        colours.append(_MARKED if setting == chosen else _BAR)
    figure = new_figure(2)
    shares, speeds = figure.subplots(1, 2, sharey=True)
    waits = [row["data_wait_share"] for row in settings]
    shares.barh(range(len(settings)), waits, color="tab:red", label="waiting for data")
    shares.barh(
        range(len(settings)), [1 - wait for wait in waits], left=waits, color=_MUTED, label="the rest"
    )
    for index, wait in enumerate(waits):
        shares.annotate(
            f"{wait:.1%} wait", (1.0, index), xytext=(4, 0), textcoords="offset points", va="center"
        )
    shares.axvline(check["threshold"], color="black", linestyle=":", linewidth=0.8)
    shares.set_xlim(0, 1.35)
    shares.set_xticks([0, 0.25, 0.5, 0.75, 1], ["0%", "25%", "50%", "75%", "100%"])
    shares.set_yticks(range(len(settings)), names)
    shares.invert_yaxis()
    shares.set_title(f"share of each step (dotted: the {check['threshold']:.0%} threshold)")
    legend_below(shares)
    rates = [row["samples_per_second"] for row in settings]
    _bars(speeds, rates, [f"{rate:.1f}" for rate in rates], colours)
    ceilings = (
        ("loader alone", check["loader_samples_per_second"], ":"),
        ("step alone", check["step_samples_per_second"], "--"),
    )
    for name, rate, style in ceilings:
        speeds.axvline(rate, color="black", linestyle=style, linewidth=0.8, label=f"{name} {rate:.1f}")
    speeds.set_xlim(0, max([*rates, *(rate for _, rate, _ in ceilings)]) * _HEADROOM)
    speeds.set_title(f"samples/s training at batch_size={check['batch_size']}")
    speeds.set_xlabel("samples/s")
    legend_below(speeds)
    return to_svg(figure, salt)


def _bars(axes: Axes, values: Sequence[float], labels: Sequence[str], colours: Sequence[str] = ()) -> None:
    """Horizontal bars, each labelled at its end; room on the right for the longest label."""
    bars = axes.barh(range(len(values)), values, color=list(colours) or _BAR)
    axes.bar_label(bars, labels=list(labels), padding=4, fontsize="small")
    axes.set_xlim(0, max([*values, 1]) * _HEADROOM)

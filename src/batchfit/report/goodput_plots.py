"""The goodput plot of an exploration given a noise scale: throughput and goodput against batch size,
with the time-optimal, the fastest and the largest measured batch marked; beside it, the statistical
efficiency, the noise scale (and its interval) and the sample tolerance."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from batchfit.report.canvas import batch_size_axis, legend_below, new_figure, to_svg

if TYPE_CHECKING:
    from matplotlib.axes import Axes

#: Each batch marked: (the goodput document's key, legend label, colour, line style).
MARKS = (
    ("time_optimal", "time-optimal", "tab:green", "-."),
    ("fastest", "fastest", "tab:blue", ":"),
    ("largest", "largest measured", "black", "--"),
)


def goodput_figure(goodput: Mapping[str, Any], salt: str) -> str:
    """Two panels over the measured batch sizes (log x): throughput and goodput in the exploration's
    unit, and the statistical efficiency."""
    figure = new_figure(2, height=4.6)
    speeds, efficiency = figure.subplots(1, 2, sharex=True)
    _speed_panel(speeds, goodput)
    _efficiency_panel(efficiency, goodput)
    sizes = [row["batch_size"] for row in goodput["rows"]]
    speeds.set_xlim(min(sizes) / 1.5, max(sizes) * 1.5)  # also around a single size
    return to_svg(figure, salt)


def _speed_panel(axes: Axes, goodput: Mapping[str, Any]) -> None:
    rows, unit = goodput["rows"], goodput["unit"]
    sizes = [row["batch_size"] for row in rows]
    axes.plot(sizes, [row["samples_per_second"] for row in rows], marker="o", label=f"throughput ({unit})")
    axes.plot(
        sizes,
        [row["goodput"] for row in rows],
        marker="s",
        color="tab:orange",
        label="goodput: throughput x efficiency",
    )
    for key, label, colour, style in MARKS:
        size = goodput[key]
        axes.axvline(size, color=colour, linestyle=style, linewidth=1, label=f"{label} batch_size={size}")
    batch_size_axis(axes)
    axes.set_ylim(0, max(row["samples_per_second"] for row in rows) * 1.1)
    axes.set_title(f"time-optimal batch_size={goodput['time_optimal']} (the highest goodput)")
    axes.set_xlabel("batch size")
    axes.set_ylabel(unit)
    legend_below(axes)


def _efficiency_panel(axes: Axes, goodput: Mapping[str, Any]) -> None:
    """Each batch's statistical efficiency, the line of the sample tolerance and the noise scale."""
    rows = goodput["rows"]
    axes.plot(
        [row["batch_size"] for row in rows],
        [row["efficiency"] for row in rows],
        marker="o",
        color="tab:purple",
        label="statistical efficiency",
    )
    tolerance = goodput["sample_tolerance"]
    axes.axhline(
        1 / (1 + tolerance),
        color="tab:gray",
        linestyle=":",
        linewidth=1,
        label=f"samples {tolerance:.0%} above the fewest",
    )
    scale, low, high = goodput["noise_scale"], goodput["noise_scale_low"], goodput["noise_scale_high"]
    if scale is not None:
        axes.axvline(scale, color="tab:red", linewidth=1, label=f"noise scale {scale:g}")
    if low is not None and high is not None:
        axes.axvspan(
            max(low, 1e-9),
            high,
            color="tab:red",
            alpha=0.12,
            label=f"its 90% interval [{low:.0f}, {high:.0f}]",
        )
    batch_size_axis(axes)
    axes.set_ylim(0, 1.05)
    title = (
        "noise scale unresolved: efficiency 1" if scale is None else f"efficiency at noise scale {scale:g}"
    )
    axes.set_title(title)
    axes.set_xlabel("batch size")
    axes.set_ylabel("samples' work against the small-batch limit")
    legend_below(axes)

"""The noise scale's plots: a measurement's readings step by step (``batchfit noise-scale``), and the
critical batch fitted to measured steps against the noise scale (``bench/noise_prediction.py``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from batchfit.policy.noise.noise_scale import GradientReading, NoiseScale, estimate
from batchfit.report.canvas import batch_size_axis, legend_below, new_figure, to_svg

if TYPE_CHECKING:
    from matplotlib.axes import Axes


def readings_of(document: Mapping[str, Any]) -> list[GradientReading]:
    """The saved readings of a ``noise-scale`` result, at its two batch sizes."""
    scale = document["noise_scale"]
    small, big = scale["small_batch_size"], scale["big_batch_size"]
    return [
        GradientReading(small, big, reading["small_norm_sq"], reading["big_norm_sq"])
        for reading in document["readings"]
    ]


def running(readings: Sequence[GradientReading]) -> list[NoiseScale]:
    """The estimate over the first 1, 2, ... readings, as the command's progress lines tell it."""
    return [estimate(readings[:count]) for count in range(1, len(readings) + 1)]


def noise_scale_figure(document: Mapping[str, Any], salt: str) -> str:
    """Three panels over the optimizer steps: each step's ``|G|^2`` and ``tr(Sigma)`` estimates with
    their running means, and the running ``B_simple`` with its 90% interval."""
    readings = readings_of(document)
    so_far = running(readings)
    steps = list(range(1, len(readings) + 1))
    figure = new_figure(3, height=4.4)
    signal, noise, scale = figure.subplots(1, 3)
    _per_step(signal, steps, [r.signal() for r in readings], [s.gradient_norm_sq for s in so_far], "|G|^2")
    _per_step(noise, steps, [r.noise() for r in readings], [s.trace_sigma for s in so_far], "tr(Sigma)")
    _running_scale(scale, steps, so_far)
    return to_svg(figure, salt)


def _per_step(axes: Axes, steps: list[int], values: list[float], means: list[float], name: str) -> None:
    axes.plot(steps, values, linestyle="none", marker="o", color="tab:gray", label=f"{name}, one step")
    axes.plot(steps, means, color="tab:blue", label=f"{name}, mean so far")
    axes.axhline(0, color="black", linewidth=0.5)
    axes.set_title(f"{name} estimate per step: {means[-1]:.4g} over {len(steps)}")
    axes.set_xlabel("optimizer step")
    axes.set_ylabel(name)
    legend_below(axes)


def _running_scale(axes: Axes, steps: list[int], so_far: list[NoiseScale]) -> None:
    """``B_simple`` over the readings so far, its interval where it has one (3+ resolved steps)."""
    resolved = [(step, s) for step, s in zip(steps, so_far, strict=True) if s.resolved]
    axes.plot(
        [step for step, _ in resolved],
        [s.b_simple for _, s in resolved],
        marker="o",
        color="tab:red",
        label="B_simple so far",
    )
    bounded = [(step, s.low, s.high) for step, s in resolved if s.low is not None and s.high is not None]
    if bounded:
        axes.fill_between(
            [step for step, _, _ in bounded],
            [low for _, low, _ in bounded],
            [high for _, _, high in bounded],
            color="tab:red",
            alpha=0.15,
            label="its 90% interval",
        )
    last = so_far[-1]
    axes.set_title(f"B_simple = {last.b_simple:.4g}" if last.resolved else "B_simple not resolved")
    axes.set_xlim(0.5, len(steps) + 0.5)
    axes.set_ylim(bottom=0)
    axes.set_xlabel("optimizer step")
    axes.set_ylabel("samples")
    legend_below(axes)


def prediction_figure(document: Mapping[str, Any], salt: str) -> str:
    """Two panels: the median steps to the target per batch size (with their range over the seeds)
    against the fitted S(B), B_crit and B_simple marked; and B_simple over the checkpoints of the
    largest batch's runs, against B_crit."""
    figure = new_figure(2, height=4.8)
    steps, scales = figure.subplots(1, 2)
    _steps_panel(steps, document)
    _checkpoints_panel(scales, document)
    return to_svg(figure, salt)


def _steps_panel(axes: Axes, document: Mapping[str, Any]) -> None:
    rows, found, intervals = document["rows"], document["fit"], document["intervals"]
    sizes = [row["batch_size"] for row in rows]
    medians = [row["median_steps"] for row in rows]
    runs = [[steps if steps is not None else float("inf") for steps in row["steps"]] for row in rows]
    below = [median - min(values) for median, values in zip(medians, runs, strict=True)]
    above = [max(values) - median for median, values in zip(medians, runs, strict=True)]
    axes.errorbar(
        sizes, medians, yerr=[below, above], fmt="o", color="black", capsize=3, label="steps: median, range"
    )
    curve = _spanning(min(sizes) / 1.5, max(sizes) * 1.5)
    s_min, b_crit = found["s_min"], found["b_crit"]
    axes.plot(
        curve,
        [s_min * (1 + b_crit / size) for size in curve],
        color="tab:blue",
        label=f"fitted S(B) = {s_min:.0f} (1 + {b_crit:.0f} / B)",
    )
    axes.axhline(s_min, color="tab:blue", linestyle=":", linewidth=1, label=f"S_min = {s_min:.0f}")
    _mark(axes, b_crit, intervals["b_crit"], "tab:blue", "B_crit")
    _mark(axes, found["b_simple_early"], intervals["b_simple_early"], "tab:red", "B_simple early")
    batch_size_axis(axes)
    axes.set_yscale("log")
    axes.set_title(f"B_crit / B_simple early = {b_crit / found['b_simple_early']:.2f}")
    axes.set_xlabel("batch size")
    axes.set_ylabel(f"steps to held-out loss {document['task']['target_loss']:g}")
    legend_below(axes)


def _spanning(low: float, high: float) -> list[float]:
    """Batch sizes from ``low`` to ``high``, 5% apart: where the fitted curve is drawn."""
    sizes = [low]
    while sizes[-1] < high:
        sizes.append(sizes[-1] * 1.05)
    return sizes


def _mark(axes: Axes, value: float, interval: Sequence[float], colour: str, name: str) -> None:
    low, high = interval
    axes.axvline(value, color=colour, linestyle="--", linewidth=1, label=f"{name} = {value:.0f}")
    axes.axvspan(low, high, color=colour, alpha=0.12, label=f"its 90% interval [{low:.0f}, {high:.0f}]")


def _checkpoints_panel(axes: Axes, document: Mapping[str, Any]) -> None:
    """Each checkpoint's B_simple (every seed's readings there), with the early ones told apart."""
    found, intervals = document["fit"], document["intervals"]
    early = document["checkpoints"][document["early_checkpoints"] - 1]["step"]
    points = [point for point in document["checkpoints"] if point["b_simple"] is not None]  # resolved
    steps = [point["step"] for point in points]
    values = [point["b_simple"] for point in points]
    errors = [
        [
            value - (point["low"] if point["low"] is not None else value)
            for value, point in zip(values, points, strict=True)
        ],
        [
            (point["high"] if point["high"] is not None else value) - value
            for value, point in zip(values, points, strict=True)
        ],
    ]
    axes.errorbar(steps, values, yerr=errors, fmt="o", color="tab:red", capsize=3, label="B_simple (90%)")
    axes.axvspan(0, early, color="tab:red", alpha=0.08, label="early: the mean of these")
    low, high = intervals["b_crit"]
    axes.axhline(found["b_crit"], color="tab:blue", linestyle="--", label=f"B_crit = {found['b_crit']:.0f}")
    axes.axhspan(low, high, color="tab:blue", alpha=0.12, label=f"its 90% interval [{low:.0f}, {high:.0f}]")
    largest = document["rows"][-1]
    axes.set_title(f"B_simple along batch {largest['batch_size']}'s runs")
    axes.set_ylim(bottom=0)
    axes.set_xlabel("optimizer step")
    axes.set_ylabel("samples")
    legend_below(axes)

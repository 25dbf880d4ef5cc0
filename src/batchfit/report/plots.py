"""The plots of a report, drawn with matplotlib into SVG text (``report.canvas``): text stays text
(``svg.fonttype`` none) so the numbers in labels can be read back, and nothing names a URL."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from batchfit.report.canvas import batch_size_axis, bytes_axis, legend_below, new_figure, to_svg
from batchfit.units import format_bytes

if TYPE_CHECKING:
    from matplotlib.axes import Axes

OUTCOME_STYLE = {  # outcome: (legend label, marker, colour)
    "ok": ("ok", "o", "tab:green"),
    "over_budget": ("over budget", "s", "tab:orange"),
    "oom": ("oom (the peak before it failed)", "x", "tab:red"),
}


def find_figure(results: Sequence[Mapping[str, Any]], salt: str) -> str:
    """Peak memory against batch size, one panel per mode side by side."""
    figure = new_figure(len(results), height=5.2)
    for axes, result in zip(figure.subplots(1, len(results), squeeze=False)[0], results, strict=True):
        _find_panel(axes, result)
    return to_svg(figure, salt)


def _find_panel(axes: Axes, result: Mapping[str, Any]) -> None:
    """One mode's search: the forecast, the fitted memory model, the trials, and the lines they
    are judged by (budget, capacity, answer)."""
    trials, forecast = result["trials"], result["predicted_trials"]
    answer = result["batch_size"]
    largest = max([answer, *(trial["batch_size"] for trial in [*trials, *forecast])])
    if forecast:
        traced = sorted(forecast, key=lambda trial: trial["batch_size"])
        axes.plot(
            [trial["batch_size"] for trial in traced],
            [trial["peak_bytes"] for trial in traced],
            linestyle=":",
            marker="D",
            markersize=4,
            color="tab:gray",
            label="forecast (traced)",
        )
    model = result.get("memory_model")
    if model is not None:
        _fitted_lines(axes, model, largest)
    _trial_points(axes, trials)
    _find_limits(axes, result)


def _fitted_lines(axes: Axes, model: Mapping[str, Any], largest: int) -> None:
    """The memory model's lines up to past the largest batch: forward/backward, and the optimizer
    step where it has one (eval has none)."""
    span = [0.0, largest * 1.1]
    lines = [("fitted: forward/backward", model["fixed_bytes"], model["bytes_per_sample"], "tab:blue")]
    step_fixed, step_slope = model.get("step_fixed_bytes"), model.get("step_bytes_per_sample")
    if step_fixed is not None and step_slope is not None and (step_fixed or step_slope):  # eval: none
        lines.append(("fitted: optimizer step", step_fixed, step_slope, "tab:cyan"))
    for label, fixed, slope, colour in lines:
        axes.plot(span, [fixed + slope * x for x in span], linestyle="--", color=colour, label=label)


def _trial_points(axes: Axes, trials: Sequence[Mapping[str, Any]]) -> None:
    """Each trial's peak, marked by its outcome, and what the caching allocator reserved (CUDA)."""
    reserved = [trial for trial in trials if trial.get("reserved_peak_bytes")]
    if reserved:  # CUDA: what the caching allocator held, which is what its cap bounds
        axes.scatter(
            [trial["batch_size"] for trial in reserved],
            [trial["reserved_peak_bytes"] for trial in reserved],
            marker="o",
            facecolors="none",
            edgecolors="tab:purple",
            s=60,
            zorder=2,
            label="reserved (caching allocator)",
        )
    for outcome, (label, marker, colour) in OUTCOME_STYLE.items():
        measured = [trial for trial in trials if trial["outcome"] == outcome]
        if measured:
            axes.scatter(
                [trial["batch_size"] for trial in measured],
                [trial["peak_bytes"] for trial in measured],
                marker=marker,
                color=colour,
                s=40,
                zorder=3,
                label=label,
            )


def _find_limits(axes: Axes, result: Mapping[str, Any]) -> None:
    """The budget, the capacity and the answer as lines, the title, axes and legend."""
    capacity, budget, answer = result["capacity_bytes"], result["budget_bytes"], result["batch_size"]
    axes.axhline(
        budget,
        color="tab:orange",
        linewidth=1,
        label=f"budget {format_bytes(budget)} ({result['memory_fraction']:g} x capacity)",
    )
    axes.axhline(capacity, color="black", linewidth=1, label=f"capacity {format_bytes(capacity)}")
    axes.axvline(answer, color="tab:green", linewidth=1, linestyle="-.", label=f"answer batch_size={answer}")
    axes.set_title(f"{result['mode']}: batch_size={answer}")
    axes.set_xlabel("batch size")
    axes.set_ylabel("peak memory")
    bytes_axis(axes, capacity)
    legend_below(axes, columns=2)


def plan_figure(plan: Mapping[str, Any], salt: str) -> str:
    """The learning rate over optimizer steps: the plan's linear warm-up to its peak, then constant,
    and for comparison the cosine and linear decays ``warmup_schedule`` offers, to 10 x the warm-up."""
    from batchfit.training_loop.schedule import Decay, lr_factor

    peak, warmup = plan["learning_rate"], plan["warmup_steps"]
    total = max(10 * warmup, 10)
    steps = list(range(total + 1))
    figure = new_figure(1)
    axes = figure.subplots()
    decays: tuple[tuple[Decay, str], ...] = (("constant", "-"), ("cosine", "--"), ("linear", ":"))
    for decay, style in decays:
        constant = f"learning_rate={peak:g}: warm-up, then constant"
        label = constant if decay == "constant" else f"decay={decay!r}, total_steps={total}"
        rates = [
            peak * lr_factor(step, warmup_steps=warmup, total_steps=total, decay=decay) for step in steps
        ]
        axes.plot(steps, rates, linestyle=style, label=label)
    if warmup:
        axes.axvline(warmup, color="tab:gray", linewidth=0.8, label=f"warmup_steps={warmup}")
    axes.set_title(f"global_batch_size={plan['global_batch_size']}: learning_rate={peak:g}")
    axes.set_xlabel("optimizer step")
    axes.set_ylabel("learning rate")
    axes.set_ylim(0, peak * 1.1)
    legend_below(axes)
    return to_svg(figure, salt)


def explore_figure(result: Mapping[str, Any], salt: str) -> str:
    """Throughput against batch size (log x) with each window's range, the tolerance band under the
    best and the recommendation; beside it, the live recommendation and its confidence over time."""
    figure = new_figure(2, height=4.6)
    throughput, history = figure.subplots(1, 2)
    _throughput_panel(throughput, result)
    _history_panel(history, result)
    return to_svg(figure, salt)


def _throughput_panel(axes: Axes, result: Mapping[str, Any]) -> None:
    """Each size's estimate with its windows' range, the tolerance band and the recommendation."""
    points, recommended = result["points"], result["recommendation"]
    best = max(point["estimate"] for point in points)
    sizes = [point["batch_size"] for point in points]
    estimates = [point["estimate"] for point in points]
    low = [point["estimate"] - min(point["samples_per_second"]) for point in points]
    high = [max(point["samples_per_second"]) - point["estimate"] for point in points]
    axes.errorbar(
        sizes,
        estimates,
        yerr=[[max(v, 0) for v in low], [max(v, 0) for v in high]],
        fmt="o",
        capsize=3,
        label="estimate (bars: the windows' range)",
        zorder=3,
    )
    for size, estimate in zip(sizes, estimates, strict=True):
        axes.annotate(
            f"{size}", (size, estimate), xytext=(5, -3), textcoords="offset points", fontsize="x-small"
        )
    tolerance = result.get("tolerance")
    if tolerance is not None:
        axes.axhspan(
            best * (1 - tolerance),
            best,
            color="tab:green",
            alpha=0.3,
            label=f"tolerance {tolerance:g} under the best",
        )
    axes.axvline(
        recommended["batch_size"],
        color="tab:green",
        linestyle="-.",
        alpha=0.7,
        zorder=1,
        label=f"recommended batch_size={recommended['batch_size']}",
    )
    batch_size_axis(axes)
    axes.set_xlim(min(sizes) / 1.5, max(sizes) * 1.5)  # also around a single size
    axes.set_ylim(0, max(max(point["samples_per_second"]) for point in points) * 1.1)
    axes.set_title(f"recommended batch_size={recommended['batch_size']} ({recommended['speedup']:.2f}x base)")
    axes.set_xlabel("batch size")
    axes.set_ylabel(result["unit"])
    legend_below(axes)


def _history_panel(axes: Axes, result: Mapping[str, Any]) -> None:
    """The recommendation's confidence after each update, and the batch size it recommended (on a
    second axis), one legend for both."""
    from matplotlib.ticker import MaxNLocator

    steps = list(range(1, len(result["history"]) + 1))
    confidences = [entry["confidence"] for entry in result["history"]]
    axes.step(steps, confidences, where="post", color="tab:blue", marker="o", label="confidence")
    axes.set_ylim(-3, 105)  # a confidence of 0 stays visible above the axis
    if len(steps) <= 10:
        axes.set_xticks(steps)
    else:
        axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_xlim(0.5, len(steps) + 0.5)
    axes.set_xlabel("recommendation update (in order)")
    axes.set_ylabel("confidence (out of 100)", color="tab:blue")
    sizes_axes = axes.twinx()
    sizes_axes.step(
        steps,
        [entry["batch_size"] for entry in result["history"]],
        where="post",
        color="tab:green",
        linestyle="--",
        marker="s",
        markersize=4,
        label="recommended batch size",
    )
    sizes_axes.set_ylabel("recommended batch size", color="tab:green")
    sizes_axes.set_ylim(0, max(point["batch_size"] for point in result["points"]) * 1.08)  # the sizes' scale
    sizes_axes.yaxis.set_major_locator(MaxNLocator(integer=True))  # batch sizes are whole
    axes.set_title(f"confidence {result['recommendation']['confidence']} at the end")
    lines = [*axes.get_legend_handles_labels()[0], *sizes_axes.get_legend_handles_labels()[0]]
    axes.legend(
        handles=lines,
        fontsize="small",
        loc="upper center",
        bbox_to_anchor=(0.5, -0.16),
        ncol=2,
        frameon=False,
    )


def analyze_figure(rows: Sequence[Mapping[str, Any]], salt: str) -> str:
    """Batch size against memory fraction, one line per mode, each point labelled with its batch."""
    figure = new_figure(1)
    axes = figure.subplots()
    modes = list(dict.fromkeys(row["mode"] for row in rows))
    for mode, colour in zip(modes, ("tab:blue", "tab:orange", "tab:green"), strict=False):
        measured = sorted(
            (row for row in rows if row["mode"] == mode), key=lambda row: row["memory_fraction"]
        )
        fractions = [row["memory_fraction"] for row in measured]
        sizes = [row["batch_size"] for row in measured]
        axes.plot(fractions, sizes, marker="o", color=colour, label=mode)
        for fraction, size in zip(fractions, sizes, strict=True):
            axes.annotate(
                f"{size}",
                (fraction, size),
                textcoords="offset points",
                xytext=(0, 6),
                ha="center",
                fontsize="small",
                color=colour,
            )
    fractions = sorted({row["memory_fraction"] for row in rows})
    axes.set_xticks(fractions, [f"{fraction:g}" for fraction in fractions])
    axes.set_xlim(min(fractions) - 0.05, max(fractions) + 0.05)
    axes.set_ylim(0, max(row["batch_size"] for row in rows) * 1.15)
    axes.set_title("largest memory-safe batch by memory fraction")
    axes.set_xlabel("memory fraction")
    axes.set_ylabel("batch size")
    legend_below(axes)
    return to_svg(figure, salt)

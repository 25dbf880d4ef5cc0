"""The tables of what a batch size does to training: bench/compare.py's techniques, bench/explore.py's
pick against its sweep, bench/batch_schedule.py's schedule, bench/noise_prediction.py's S(B) and
bench/bf16_kernels.py's step with and without bfloat16 kernels, bench/verb_minutes.py's minutes per
verb."""

from __future__ import annotations

import math
from typing import Any

from _tables_base import markdown, provenance
from _truth import CHECK_STEPS, Curve, judge


def compare_table(files: list[dict[str, Any]]) -> str:
    """bench/compare.py's rows that have a largest batch, each judged on its truth."""
    lines = []
    for data in files:
        bound = data.get("max_batch_size", 1024)
        for case in data["cases"]:
            rows, truths = case["comparison"]["rows"], case["truths"]
            for row, truth in zip(rows, truths, strict=True):
                if truth is None or row["batch_size"] is None:
                    continue
                answer = row["batch_size"]
                if isinstance(truth, dict):
                    curve = Curve.from_dict(truth)
                    verdict = judge(curve, answer, bound)
                    said = "exact" if verdict.exact else f"truth {verdict.reference}"
                    if verdict.trains is False:
                        said += f", fails {CHECK_STEPS} steps"
                    described = curve.describe()
                else:  # the bisected truth of the older files
                    said = "exact" if truth == answer else f"truth {truth}"
                    described = f"{truth} (bisected)"
                ratio = row.get("throughput_ratio")
                lines.append(
                    [
                        case["workload"],
                        case["limit"],
                        row["technique"],
                        str(answer),
                        said,
                        described,
                        "-" if row.get("batch_ratio") is None else f"{row['batch_ratio']:.2f}x",
                        "-" if ratio is None else f"{ratio:.2f}x",
                    ]
                )
    headers = ["workload", "limit", "technique", "answer", "verdict", "truth", "x batch", "x samples/s"]
    return markdown(headers, lines, (0, 1, 2, 4, 5)) + "\n\n" + "\n".join(provenance(f) for f in files)


def explore_replay_table(files: list[dict[str, Any]]) -> str:
    """bench/explore_replay.py's rows: per recorded curve, quality and time over three interleaved
    passes of the sweep's sizes, across its replays."""
    lines = []
    for data in files:
        for row in data["rows"]:
            common = ", ".join(list(row["picks"])[:3])
            lines.append(
                [
                    row["curve"].split("@")[0],
                    row["device"],
                    str(row["max_batch_size"]),
                    str(row["replays"]),
                    f"{row['quality_met']:.0%}",
                    f"{row['quality_p10']:.3f}",
                    f"{row['interleaved_ratio_median']:.2f}",
                    f"{row['interleaved_ratio_p90']:.2f}",
                    f"{row['sweep_ratio_median']:.2f}",
                    f"{row['both_met']:.0%}",
                    f"{row['confident']:.0%}",
                    common,
                ]
            )
    headers = [
        "curve",
        "recorded on",
        "max",
        "replays",
        "quality >= 0.97",
        "quality p10",
        "time / 3 interleaved passes (median)",
        "p90",
        "time / sweep (median)",
        "both targets",
        "confident",
        "common picks",
    ]
    footer = "\n\n".join(provenance(data) for data in files)
    return f"{markdown(headers, lines, (0, 1, 11))}\n\n{footer}"


def explore_table(files: list[dict[str, Any]]) -> str:
    """bench/explore.py's rows: the pick against the sweep's truth."""
    lines = []
    for data in files:
        for row in data["rows"]:
            ours = row["batchfit"]
            lines.append(
                [
                    row["example"],
                    str(row["max_batch_size"]),
                    str(row["sweep_best_batch_size"]),
                    str(row["truth_pick"]),
                    str(ours["recommended"]),
                    f"{ours['confidence']} ({ours['stop_reason']})",
                    f"{row['quality']:.3f}",
                    f"{ours['seconds']:.1f}",
                    f"{row['sweep']['seconds']:.1f}",
                    f"{row['time_ratio']:.3f}",
                ]
            )
    headers = [
        "example",
        "max",
        "truth's best",
        "truth's 3% pick",
        "bf pick",
        "bf confidence",
        "quality",
        "bf s",
        "sweep s",
        "time ratio",
    ]
    return markdown(headers, lines, (0, 5)) + "\n\n" + "\n".join(provenance(f) for f in files)


def _times(value: float, base: float) -> str:
    return f"{value / base:.2f}x" if base > 0 else "-"


def batch_schedule_table(files: list[dict[str, Any]]) -> str:
    """``bench/batch_schedule.py``: each method's steps, samples and predicted time to the target,
    medians over the seeds, and the schedule's over each (the schedule is the last row)."""
    (data,) = files
    rows, seeds = data["rows"], data["task"]["seeds"]
    schedule = rows[-1]
    lines = [
        [row["method"], f"{row['reached']}/{seeds}", f"{row['steps']:.0f}", f"{row['samples']:.0f}",
         f"{row['predicted_seconds']:.2f}", _times(schedule["samples"], row["samples"]),
         _times(schedule["predicted_seconds"], row["predicted_seconds"])]
        for row in rows
    ]  # fmt: skip
    headers = ["method", "reached", "steps", "samples", "predicted s", "schedule's samples / this",
               "schedule's time / this"]  # fmt: skip
    return markdown(headers, lines, (0,)) + "\n\n" + provenance(data)


def noise_prediction_table(files: list[dict[str, Any]]) -> str:
    """``bench/noise_prediction.py``: steps to the target per batch size against the fitted S(B),
    then the fit's and the ratio's lines as the bench printed them."""
    (data,) = files
    fit = data["fit"]
    lines = []
    for row in data["rows"]:
        runs = [math.inf if steps is None else steps for steps in row["steps"]]
        lines.append(
            [
                str(row["batch_size"]),
                f"{row['learning_rate']:g}",
                f"{row['median_steps']:.0f}",
                f"{min(runs):.0f}-{max(runs):.0f}",
                f"{fit['s_min'] * (1 + fit['b_crit'] / row['batch_size']):.0f}",
            ]
        )
    headers = ["batch", "learning rate", "steps (median)", "steps (range)", "fitted S(B)"]
    said = "\n".join(f"- {line}" for line in data["lines"])
    return f"{markdown(headers, lines, ())}\n\n{said}\n\n{provenance(data)}"


def bf16_kernels_table(files: list[dict[str, Any]]) -> str:
    """``bench/bf16_kernels.py``: one step's seconds in float32 and under bf16 autocast, with this
    CPU's oneDNN bfloat16 kernels and with oneDNN capped below them."""
    (data,) = files
    isa = data["capped_isa"]
    lines = [
        [
            row["model"],
            f"{row['float32_seconds']:.3f} s",
            f"{row['bf16_seconds']:.3f} s",
            f"{row['bf16_capped_seconds']:.3f} s ({row['capped_over_float32']:.0f}x float32)",
        ]
        for row in data["rows"]
    ]
    headers = ["step", "float32", "bf16 autocast", f"bf16 autocast, `ONEDNN_MAX_CPU_ISA={isa}`"]
    return f"{markdown(headers, lines, (0,))}\n\n{provenance(data)}"


def verb_minutes_table(files: list[dict[str, Any]]) -> str:
    """``bench/verb_minutes.py``: minutes per timing verb on a workload (the README's example, or the
    held-out GPT), with this CPU's kernels and with oneDNN capped below bfloat16's, against each
    verb's budget."""
    (data,) = files
    lines = [
        [
            f"`{run['verb']}`",
            run["onednn_max_cpu_isa"] or "this CPU's",
            f"{run['seconds'] / 60:.2f}",
            f"{run['budget_seconds']:.0f} s",
            f"{run['over_budget']:.2f}",
            ", ".join(run["slow_rows"]) or "-",
            ", ".join(run["not_measured"]) or "-",
        ]
        for run in data["runs"]
    ]
    headers = ["verb", "kernels", "minutes", "budget", "time / budget", "clearly slower", "not measured"]
    return f"{markdown(headers, lines, (0, 1, 5, 6))}\n\n{provenance(data)}"

"""The tables, transcripts and summary lines of README.md and docs/, made from committed results files.

Each one sits between two marker comments that say what makes it:

    <!-- table: KIND FILE [FILE ...] -->
    ...what this script writes...
    <!-- /table -->

KIND is one of ``RENDERERS``; the files are paths from the repository's root. ``python
bench/tables.py`` rewrites every such block from its files; ``--check`` only says which differ
(``tests/bench/test_tables.py`` runs it). Files written before the harness recorded the commit,
the device's name and the command get those from ``NOTES``, what the session notes said.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _readings import cell, read_row, said
from _truth import CHECK_STEPS, TRUTH_STEPS, WINDOW, Curve, judge, spans

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = ("README.md", "docs/*.md")
BLOCK = re.compile(
    r"(<!-- table: (?P<spec>[a-z][a-z-]* [^>]*?) -->)(?P<body>.*?)(<!-- /table -->)", re.DOTALL
)
#: The largest answer each method of ``bench/find.py`` may give (its BOUNDS).
FIND_BOUNDS: dict[str, int | None] = {"batchfit": 512, "lightning": None, "accelerate": 512}


@dataclass(frozen=True)
class Note:
    """What a session's notes say of a results file that does not record it itself."""

    commit: str
    device_name: str
    command: str
    date: str


_H100 = "NVIDIA H100 80GB HBM3"
_H200 = "NVIDIA H200"
#: Results files written before the harness recorded the code, the device's name and the command,
#: with what docs/benchmarks.md's session notes said of them when they were committed (04a15a0 and
#: 6b32440). The H100's record batchfit 0.1.0, the H200's no version at all (``batchfit: null``).
NOTES: dict[str, Note] = {
    "bench/data/h100-2026-11-25/find-cuda-resnet50-amp-gpt2-resnet50.json": Note(
        "a3b253b", _H100, "bash bench/gpu_session.sh find:resnet50-amp,gpt2,resnet50", "2026-11-25"
    ),
    "bench/data/h100-2026-11-25/find-cuda-mlp-cnn-transformer.json": Note(
        "9c34277", _H100, "bash bench/gpu_session.sh find:mlp,cnn,transformer", "2026-11-25"
    ),
    "bench/data/h100-2026-11-25/find-curves-cuda-cnn-transformer.json": Note(
        "a3b253b", _H100, "bash bench/gpu_session.sh curves:cnn,transformer", "2026-11-25"
    ),
    "bench/data/h100-2026-11-25/find-curves-cuda-resnet50-amp.json": Note(
        "a3b253b", _H100, "bash bench/gpu_session.sh curves:resnet50-amp", "2026-11-25"
    ),
    "bench/data/h200-2026-11-26/find-cuda-resnet50-amp-resnet50-mlp-cnn-transformer.json": Note(
        "cccf28b",
        _H200,
        "bash bench/gpu_session.sh find:resnet50-amp,resnet50,mlp,cnn,transformer",
        "2026-11-26",
    ),
    "bench/data/h200-2026-11-26/find-cuda-expandable-cnn-transformer-mlp-resnet50-amp.json": Note(
        "cccf28b",
        _H200,
        "bash bench/gpu_session.sh expandable:cnn,transformer,mlp,resnet50-amp",
        "2026-11-26",
    ),
    "bench/data/h200-2026-11-26/compare-cuda-resnet50.json": Note(
        "cccf28b", _H200, "bash bench/gpu_session.sh compare:resnet50", "2026-11-26"
    ),
    "bench/data/h200-2026-11-26/explore-cuda-resnet50-amp.json": Note(
        "cccf28b", _H200, "bash bench/gpu_session.sh explore:resnet50-amp", "2026-11-26"
    ),
}


def load(path: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((ROOT / path).read_text())
    data["path"] = path
    return data


def provenance(data: dict[str, Any]) -> str:
    """Where a file's figures come from: its command, commit, device, torch and date."""
    path = data.get("path", "this run")
    note = NOTES.get(path)
    code = data.get("code")
    if code is not None:
        commit = f"`{code['commit'][:7] if code['source'] != 'version' else code['commit']}`"
        if code["source"] == "version":
            commit = f"batchfit {code['commit']} (no checkout)"
        elif code.get("uncommitted_changes"):
            commit += " with uncommitted changes"
        where, command, date = data["device_name"], data["command"], data["written"][:10]
    elif note is not None:
        recorded = data.get("versions", {}).get("batchfit")
        said = f"batchfit {recorded}" if recorded else "no commit (`batchfit: null`)"
        commit = f"`{note.commit}` (from the session notes; the file records {said})"
        where, command, date = note.device_name, note.command, note.date
    else:
        raise ValueError(f"{path} records no commit and NOTES has none for it")
    command = re.sub(r"\S*/python3?(?=\s)", "python", command)  # the interpreter, wherever it lives
    torch = data.get("torch") or data["versions"]["torch"]
    seconds = f", {data['total_seconds']:.0f} s" if "total_seconds" in data else ""
    load = data.get("load_average_at_start", "").split(" ")[0]
    shared = f", load average {load} at its start" if load else ""
    return (
        f"`{path}`: `{command}` at {commit} on {where} ({data['device']}), torch {torch}, {date}"
        f"{seconds}{shared}."
    )


def markdown(headers: list[str], lines: list[list[str]], text_columns: Iterable[int]) -> str:
    text = set(text_columns)
    rule = "|".join("---" if i in text else "---:" for i in range(len(headers)))
    return "\n".join(
        ["| " + " | ".join(headers) + " |", f"|{rule}|", *("| " + " | ".join(line) + " |" for line in lines)]
    )


# find: a row's truth is a curve (``_truth.scan``) or, in files written before it, a number bisected
# from batchfit's answer ("true_max", at most "upper").


def _cap(row: dict[str, Any]) -> str:
    cap = row["case"]["cap"]
    return f"{cap} ({row['cap_bytes'] / 2**20:.0f} MiB)" if cap.startswith("ref:") else cap


def _name(row: dict[str, Any]) -> str:
    return str(row["case"]["workload"]) + (" (cudnn.benchmark)" if row["case"].get("cudnn_benchmark") else "")


def _method(row: dict[str, Any], name: str) -> dict[str, Any] | None:
    result: dict[str, Any] | None = row["batchfit"] if name == "batchfit" else row["competitors"].get(name)
    return result


def _verdict_cell(row: dict[str, Any], name: str) -> str:
    """A method's answer and its verdict: ``124 exact``, ``241, truth 242``, ``243, fails 20 steps``."""
    result = _method(row, name)
    if result is None:
        return "n/a"
    answer = result["answer"]
    if answer is None:
        return "error"
    truth = row["truth"]
    if "fits" in truth:
        verdict = judge(Curve.from_dict(truth), answer, FIND_BOUNDS.get(name))
        reference, trains = verdict.reference, verdict.trains
    else:  # the bisected truth of the older files
        reference, trains = truth["true_max"], result["trains"]
        if answer > truth["upper"]:
            said = f"{answer}, above the truth's ceiling ({truth['upper']})"
            return said + (f", trains {CHECK_STEPS} steps" if trains else f", fails {CHECK_STEPS} steps")
    if answer == reference and trains:
        return f"{answer} exact"
    said = f"{answer}" if answer == reference else f"{answer}, truth {reference or 'nothing fits'}"
    return said + (f", fails {CHECK_STEPS} steps" if trains is False else "")


def _ratio(row: dict[str, Any], name: str, field: str) -> str:
    result, ours = _method(row, name), row["batchfit"]
    if result is None or result["answer"] is None:
        return "-"
    value = len(result["sizes"]) if field == "trials" else result["seconds"]
    base = len(ours["sizes"]) if field == "trials" else ours["seconds"]
    return f"{value / base:.1f}x" if base else "-"


def _truth_cell(row: dict[str, Any], width: float | None = None) -> str:
    """The truth of a row; ``width`` 0 (a file's ``truth.window``): a boundary check, not a scan."""
    truth = row["truth"]
    if "fits" not in truth:
        found = "nothing fits" if truth["true_max"] is None else truth["true_max"]
        probes = f"{truth['probes']} probe{'s' * (truth['probes'] != 1)}"
        return f"{found} (bisected from batchfit's answer, {probes})"
    curve = Curve.from_dict(truth)
    reach = f"; fits to the scan's reach ({curve.reach})" if curve.reach else ""
    boundary = " (the boundary alone, no scan)" if width == 0 else ""
    return curve.describe() + reach + boundary


def find_table(files: list[dict[str, Any]]) -> str:
    """bench/find.py's rows: each method's answer judged on the truth, trials and seconds."""
    competitors = [n for n in FIND_BOUNDS if n != "batchfit" and any(_ran(f, n) for f in files)]
    headers = ["workload", "cap", f"truth ({TRUTH_STEPS} steps)", "batchfit", STRICT, "trials (sizes)", "s"]
    for name in competitors:
        headers += [name, "trials/bf", "s/bf"]
    lines = []
    for data in files:
        window = data.get("truth", {}).get("window", WINDOW) if data.get("truth") else 0.0
        for row in data["rows"]:
            ours = row["batchfit"]
            readings = read_row(row, "batchfit", FIND_BOUNDS["batchfit"], window)
            line = [
                _name(row),
                _cap(row),
                _truth_cell(row, data.get("truth", {}).get("window")),
                _verdict_cell(row, "batchfit"),
                "-" if readings is None else cell(readings),
                f"{len(ours['sizes'])} ({' '.join(map(str, ours['sizes']))})",
                f"{ours['seconds']:.2f}",
            ]
            for name in competitors:
                line += [_verdict_cell(row, name), _ratio(row, name, "trials"), _ratio(row, name, "seconds")]
            lines.append(line)
    return markdown(headers, lines, (0, 1, 2, 3, 4, 5)) + "\n\n" + "\n".join(provenance(f) for f in files)


#: The strict readings' column (``_readings``): largest fitting size probed up to the bound; no failure
#: probed below; trains CHECK_STEPS steps. ``-``: not measured.
STRICT = f"strictly: largest / none below fails / trains {CHECK_STEPS}"


def _ran(data: dict[str, Any], name: str) -> bool:
    return any(row["competitors"].get(name) is not None for row in data["rows"])


def find_summary(files: list[dict[str, Any]]) -> str:
    """A line: in how many rows batchfit's answer reads yes three ways (``_readings``), in A-B trials."""
    rows, strict = [], 0
    for data in files:
        window = data.get("truth", {}).get("window", WINDOW) if data.get("truth") else 0.0
        for row in data["rows"]:
            rows.append(row)
            readings = read_row(row, "batchfit", FIND_BOUNDS["batchfit"], window)
            strict += readings is not None and readings.strict is True
    trials = [len(row["batchfit"]["sizes"]) for row in rows]
    spread = f"{min(trials)}" if min(trials) == max(trials) else f"{min(trials)}-{max(trials)}"
    return (
        f"the largest size that fits among those scanned, with none failing below it, and trains "
        f"{CHECK_STEPS} steps in {strict} of {len(rows)} rows, in {spread} trials"
    )


#: Each strict reading: what it says, and why a row reads no.
_READINGS = {
    "largest": ("the largest fitting size probed up to its bound", "fitting_above", "fit above it"),
    "none_below_fails": ("no size probed below it fails", "failing_below", "fail below it"),
    "trains": (f"it trains {CHECK_STEPS} steps", "", f"it fails {CHECK_STEPS} steps"),
}


def _reading_line(rows: list[dict[str, Any]], field: str) -> str:
    """A reading's count, the rows that read no (grouped by why) and the rows it could not read."""
    what, why_field, why = _READINGS[field]
    ours = [row["methods"]["batchfit"] for row in rows]
    yes = sum(found[field] is True for found in ours)
    unread = sum(found[field] is None for found in ours)
    noes: dict[str, list[str]] = {}
    for row, found in zip(rows, ours, strict=True):
        if found[field] is False:
            sizes = found[why_field] if why_field else ""
            reason = f"{sizes} {why}" if sizes else ("it fails 10 steps" if field == "largest" else why)
            noes.setdefault(reason, []).append(f"{row['workload']}'s {found['answer']}")
    text = f"{what} in {yes} of {len(rows)}"
    if noes:
        text += " (not " + "; ".join(f"{', '.join(names)}: {reason}" for reason, names in noes.items()) + ")"
    return text + (f", not measured in {unread}" if unread else "")


def find_readings_summary(files: list[dict[str, Any]]) -> str:
    """``bench/find_readings.py``'s rows of the recorded files after it, read strictly: each reading's
    count with the rows that read no, the rows reading yes three ways, and batchfit's trials."""
    readings, *recorded = files
    paths = {data["path"] for data in recorded}
    rows = [row for row in readings["rows"] if row["file"] in paths]
    strict = sum(row["methods"]["batchfit"]["strict"] is True for row in rows)
    said = "; ".join(_reading_line(rows, field) for field in _READINGS)
    trials = [row["trials"] for row in rows]
    spread = f"{min(trials)}" if min(trials) == max(trials) else f"{min(trials)}-{max(trials)}"
    weak = [row for row in rows if row["methods"]["batchfit"]["weak_exact"]]
    called = [f"{row['workload']}'s {row['methods']['batchfit']['answer']}" for row in weak]
    called = [
        name
        for row, name in zip(weak, called, strict=True)
        if row["methods"]["batchfit"]["strict"] is not True
    ]
    differ = (
        f" (the weak check, called exact before, held where they do not: {', '.join(called)})"
        if called
        else ""
    )
    return f"{said}; all three in {strict} of {len(rows)} rows{differ}, in {spread} trials"


def find_readings_table(files: list[dict[str, Any]]) -> str:
    """``bench/find_readings.py``: every recorded GPU row, batchfit's answer read three ways beside
    the weak verdict the tables called exact."""
    (data,) = files
    lines = []
    for row in data["rows"]:
        ours = row["methods"]["batchfit"]
        differ = "yes" if ours["weak_exact"] and ours["strict"] is not True else ""
        lines.append(
            [
                f"`{Path(row['file']).parent.name}`",
                row["workload"],
                row["cap"],
                row["truth_kind"],
                str(ours["answer"]),
                "yes" if ours["weak_exact"] else "no",
                said(ours["largest"]) + (f": {ours['fitting_above']} fit" if ours["fitting_above"] else ""),
                said(ours["none_below_fails"])
                + (f": {ours['failing_below']} fail" if ours["failing_below"] else ""),
                said(ours["trains"]),
                differ,
            ]
        )
    headers = ["session", "workload", "cap", "truth", "answer", "weak check", "largest probed up to 512"]
    headers += ["none below fails", f"trains {CHECK_STEPS}", "weak check holds, a strict reading does not"]
    return markdown(headers, lines, (0, 1, 2, 3, 5, 6, 7, 8, 9)) + "\n\n" + provenance(data)


def curves_table(files: list[dict[str, Any]]) -> str:
    """Which sizes trained 10 steps in ``bench/find_curves.py``'s recordings: a size whose 2-step
    trial failed did not train 10; a fitting one's 10-step trial says."""
    lines = []
    for data in files:
        for curve in data["curves"]:
            verdicts: dict[int, bool] = {}
            for point in curve["points"]:
                long = point.get("long")
                verdicts[point["batch_size"]] = (long or point["short"])["outcome"] == "ok"
            near = {b: fit for b, fit in verdicts.items() if b >= 0.85 * (curve["largest_fitting"] or 1)}
            fitting = [b for b, fit in sorted(near.items()) if fit]
            failing = [b for b, fit in sorted(near.items()) if not fit]
            first = min(failing, default=None)
            above = [b for b in fitting if first is not None and b > first]
            lines.append(
                [
                    curve["name"],
                    f"{curve['cap']} ({curve['cap_bytes'] / 2**20:.0f} MiB)",
                    spans(fitting),
                    spans(failing),
                    "yes" if not above else f"no: {spans(above)} fit above {first}",
                ]
            )
    headers = ["workload", "cap", f"fits {TRUTH_STEPS} steps", "fails", "monotone"]
    return markdown(headers, lines, (0, 1, 2, 3, 4)) + "\n\n" + "\n".join(provenance(f) for f in files)


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


def timings_table(files: list[dict[str, Any]]) -> str:
    """Each run's wall time and the load average at its start, as its results file records them."""
    lines = []
    for data in files:
        note = NOTES.get(data["path"])
        command = data.get("command", note.command if note else "?")
        device = data.get("device_name") or (note.device_name if note else data["device"])
        load = data.get("load_average_at_start", "-").split(" ")[0]
        lines.append([f"`{command}`", device, f"{data['total_seconds']:.0f}", load, f"`{data['path']}`"])
    return markdown(["command", "device", "seconds", "load average", "file"], lines, (0, 1, 4))


def forecast_trained_table(files: list[dict[str, Any]]) -> str:
    """``bench/forecast_trained.py``: each case's search from a fresh optimizer and after a step."""
    (data,) = files
    lines = [
        [row["case"], row["limit"], row["optimizer"], str(row["batch_size"]),
         ", ".join(map(str, row["trials"])), str(row["traces"]),
         f"{row['wall_seconds']:.2f}", f"{row['cpu_seconds']:.2f}"]
        for row in data["rows"]
    ]  # fmt: skip
    headers = ["case", "cap", "optimizer", "answer", "real trials", "fake-tensor traces", "wall s", "CPU s"]
    return markdown(headers, lines, (0, 1, 2, 4)) + "\n\n" + provenance(data)


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


def predict_table(files: list[dict[str, Any]]) -> str:
    """``bench/predict.py``: each target cap's truth, the prediction recorded under another cap
    (and from the CPU alone, where run) and MemTracker's answer, each with its error and verdict,
    and whether the truth lies in the prediction's band; a row per mode (files before eval: train).
    A case recorded from the CPU alone says how: by a fake-tensor trace or by real trials."""
    rows = [(case, row) for data in files for case in data["cases"] for row in case["targets"]]
    alone = any(row.get("cpu_alone") for _, row in rows)
    banded = ["error", "within", "truth in band"]
    headers = ["workload", "mode", "recorded under", "cap", f"truth ({TRUTH_STEPS} steps)", "largest",
               "predicted (band)", *banded]  # fmt: skip
    headers += ["from the CPU alone", *banded] if alone else []
    headers += ["MemTracker", "error", "within"]
    lines = []
    for case, row in rows:
        curve = Curve.from_dict(row["truth"])
        reach = f"; fits to the scan's reach ({curve.reach})" if curve.reach else ""
        recorded, cap = _mib(case["recorded"], case["recorded_bytes"]), _mib(row["cap"], row["cap_bytes"])
        mode = row.get("mode", "train")
        by = case.get("recorded_by", {}).get(mode) if case["recorded_bytes"] is None else None
        recorded += f" ({by})" if by else ""  # the CPU alone: by a trace, or by trials (files before: -)
        line = [case["workload"], mode, recorded, cap, curve.describe() + reach]
        line += [str(row["true_largest"]), *_judged(row["predicted"], banded=True)]
        line += _judged(row.get("cpu_alone"), banded=True) if alone else []
        line += _judged(row["memtracker"])
        lines.append(line)
    text = [i for i, header in enumerate(headers) if header not in ("largest", "error")]
    return markdown(headers, lines, text) + "\n\n" + "\n".join(provenance(f) for f in files)


def _mib(cap: str, nbytes: int | None) -> str:
    return f"{cap} ({(nbytes or 0) / 2**20:.0f} MiB)" if cap.startswith("ref:") else cap


def _judged(judged: dict[str, Any] | None, banded: bool = False) -> list[str]:
    """A method's answer (with its band), its error in samples and per cent, the verdict, and
    (``banded``) whether the truth lies in its band."""
    inside = [] if not banded else ["-" if judged is None else _yes(judged.get("truth_in_band"))]
    if judged is None:
        return ["-", "-", "-", *inside]
    band = judged.get("band")
    answer = "none" if judged["answer"] is None else str(judged["answer"])
    if band:
        answer += f" ({'none' if band[0] is None else band[0]}-{'none' if band[1] is None else band[1]})"
    if judged["error_samples"] is None:
        return [answer, "-", "-", *inside]
    error = f"{judged['error_samples']:+d} ({judged['error_percent']:+.1f}%)"
    return [answer, error, "yes" if judged["within"] else "no", *inside]


def _yes(flag: bool | None) -> str:
    return "-" if flag is None else "yes" if flag else "no"


def _times(value: float, base: float) -> str:
    return f"{value / base:.2f}x" if base > 0 else "-"


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


def transcript_block(files: list[dict[str, Any]], short: bool = False) -> str:
    """A recorded command (``bench/transcript.py``): the command, what it wrote, and where from;
    ``short``: stdout up to its first blank line, then ``...``."""
    (data,) = files
    shown = " ".join(data["argv"])
    shown = re.sub(r"^\S*python3? -m batchfit", "batchfit", shown)
    shown = re.sub(r"^\S*python3? ", "python ", shown)
    shown = " ".join([*(f"{name}={value}" for name, value in data.get("env", {}).items()), shown])
    if data.get("cwd", ".") != ".":
        shown = f"cd {data['cwd']} && {shown}"
    stdout = data["stdout"]
    if short and "\n\n" in stdout.strip("\n"):  # what follows the first blank line, left out
        stdout = stdout.strip("\n").split("\n\n")[0] + "\n...\n"
    output = (data["stderr"] + stdout).rstrip("\n")
    return f"```\n$ {shown}\n{output}\n```\n\n{provenance(data)}"


def allocator_history_table(files: list[dict[str, Any]]) -> str:
    """``bench/allocator_history.py``: each recorded trial's trace (entries, the segments CUDA
    allocated and freed), its peak allocated and what its segments held at the end."""
    lines = []
    for data in files:
        for trial in data["trials"]:
            actions = [entry.split(" ", 1)[0] for entry in trial["entries"]]
            reserved = sum(segment["total_size"] for segment in trial["segments_at_end"])
            lines.append(
                [
                    data["workload"],
                    str(trial["batch_size"]),
                    f"{len(actions)}{' (oldest dropped)' if trial['dropped'] else ''}",
                    str(actions.count("segment_alloc")),
                    str(actions.count("segment_free")),
                    f"{trial['peak_allocated_bytes'] / 2**20:.1f}",
                    f"{reserved / 2**20:.1f}",
                ]
            )
    headers = ["workload", "batch", "trace entries", "segments allocated", "segments freed"]
    headers += ["peak allocated (MiB)", "reserved at the end (MiB)"]
    said = "\n".join(f"- {provenance(data)}" for data in files)
    return f"{markdown(headers, lines, (0,))}\n\n{said}"


def _mib_error(value: int, truth: int) -> str:
    return f"{(value - truth) / 2**20:+.1f} ({(value - truth) / truth:+.1%})"


def predict_histories_table(files: list[dict[str, Any]]) -> str:
    """``bench/predict_histories.py``: CUDA's recorded trials on the model of its allocator, the
    replay of batch 2 and 4 at 8, and the CPU alone at 2, 4 and 8, each beside CUDA's figures."""
    (data,) = files
    model = []
    for row in data["model"]:
        alike = f"{row['placed_alike']}/{row['requests']}"
        model.append(
            [
                row["workload"],
                str(row["batch_size"]),
                f"{len(row['cuda_segments'])} / {len(row['model_segments'])}",
                f"{row['cuda_reserved_bytes'] / 2**20:.1f}",
                f"{row['model_reserved_bytes'] / 2**20:.1f}",
                _mib_error(row["model_reserved_bytes"], row["cuda_reserved_bytes"]),
                f"{row['cuda_peak_allocated_bytes'] / 2**20:.1f}",
                f"{row['model_peak_allocated_bytes'] / 2**20:.1f}",
                alike,
            ]
        )
    headers = ["workload", "batch", "segments taken (CUDA / model)", "reserved, CUDA (MiB)", "model (MiB)"]
    headers += ["error (MiB)", "peak allocated, CUDA (MiB)", "model (MiB)", "requests placed alike"]
    tables = [markdown(headers, model, (0, 2))]
    replay = []
    for row in data["replay"]:
        if not row["aligned"]:
            replay.append([row["workload"], *["-"] * 6, "not aligned: " + str(row["events"])])
            continue
        four = next(r for r in data["model"] if r["workload"] == row["workload"] and r["batch_size"] == 4)
        per_sample = (row["cuda_peak_allocated_bytes"] - four["cuda_peak_allocated_bytes"]) / 4
        error = row["replay_peak_allocated_bytes"] - row["cuda_peak_allocated_bytes"]
        samples = f"{error / per_sample:+.2f}" if per_sample > 2**20 else "-"
        replay.append(
            [
                row["workload"],
                f"{row['cuda_peak_allocated_bytes'] / 2**20:.1f}",
                _mib_error(row["replay_peak_allocated_bytes"], row["cuda_peak_allocated_bytes"]),
                f"{row['cuda_reserved_bytes'] / 2**20:.1f}",
                _mib_error(row["replay_peak_reserved_bytes"], row["cuda_reserved_bytes"]),
                f"{per_sample / 2**20:.1f}",
                samples,
                str(row["largest_under_cuda_reserved_at_8"]),
            ]
        )
    headers = [
        "workload",
        "peak allocated at 8, CUDA (MiB)",
        "replay's error (MiB)",
        "reserved at 8, CUDA (MiB)",
    ]
    headers += ["replay's error (MiB)", "CUDA's MiB a sample (4 to 8)", "allocated error in samples"]
    headers += ["largest placed under CUDA's reserved at 8"]
    tables.append(markdown(headers, replay, (0, 7)))
    alone = []
    for row in data["cpu_alone"]:
        for point in row["points"]:
            alone.append(
                [
                    row["workload"],
                    str(point["batch_size"]),
                    f"{point['cuda_peak_allocated_bytes'] / 2**20:.1f}",
                    _mib_error(point["cpu_peak_allocated_bytes"], point["cuda_peak_allocated_bytes"]),
                    f"{point['cuda_reserved_bytes'] / 2**20:.1f}",
                    _mib_error(point["cpu_peak_reserved_bytes"], point["cuda_reserved_bytes"]),
                ]
            )
    headers = ["workload", "batch", "peak allocated, CUDA (MiB)", "CPU alone's error (MiB)"]
    headers += ["reserved, CUDA (MiB)", "CPU alone's error (MiB)"]
    tables.append(markdown(headers, alone, (0,)))
    skipped = "\n".join(
        f"- not from the CPU alone: {name}: {why}" for name, why in data["cpu_alone_skipped"].items()
    )
    return "\n\n".join([*tables, skipped, provenance(data)])


def standin_agreement_table(files: list[dict[str, Any]]) -> str:
    """``bench/standin_agreement.py``: per truth row, the sizes probed, those the model agrees on,
    where it does not, and each truth edge beside the model's nearest."""
    (data,) = files
    lines = []
    for row in data["rows"]:
        missed = [int(size) for size, both in row["sizes"].items() if both["truth"] != both["model"]]
        edges = "; ".join(
            f"{edge['truth']}: {'none' if edge['off'] is None else edge['off']}" for edge in row["edges"]
        )
        lines.append(
            [
                row["workload"],
                f"{row['truth_kind']}, {Path(row['truth_file']).parent.name}",
                f"{row['cap_bytes'] / 2**20:.1f}",
                str(row["scanned"]),
                str(row["agreeing"]),
                f"{row['agreeing'] / row['scanned']:.0%}",
                spans(missed) or "-",
                edges or "-",
            ]
        )
    total = data["summary"]
    headers = ["workload", "truth", "cap (MiB)", "sizes probed", "agree", "agreement", "disagree at"]
    headers += ["truth edge: model's nearest, samples off"]
    said = (
        f"In all: {total['agreeing']} of {total['scanned']} sizes agree "
        f"({total['agreeing'] / total['scanned']:.1%}); {total['edges_within']} of {total['edges']} "
        f"truth edges have a model edge within {data['target']['edge']}. Target "
        f"({data['target']['agreement']:.0%} of sizes, every edge within {data['target']['edge']}): "
        f"{'met' if total['met'] else 'not met'}."
    )
    return f"{markdown(headers, lines, (0, 1, 6, 7))}\n\n{said}\n\n{provenance(data)}"


def trials_replay_table(files: list[dict[str, Any]]) -> str:
    """``bench/trials_replay.py`` before and after a change to the search: per case, the truth's
    largest fitting size and the top of its band from below, the saved prediction's answer, the
    search's answer, and its real trials (x: out of memory) in each file."""
    before, after = files
    lines = []
    for old, new in zip(before["rows"], after["rows"], strict=True):
        tried = [" ".join(f"{size}{'' if outcome == 'ok' else 'x'}" for size, _, outcome in row["trials"])
                 for row in (old, new)]  # fmt: skip
        lines.append([new["workload"], f"{new['truth_kind']}, {new['cap_bytes'] / 2**20:.1f}",
                      str(new["truth_largest"]), str(new["truth_band_top"]), str(new["seed"]),
                      str(new["answer"]), f"{old['real_trials']}: {tried[0]}",
                      f"{new['real_trials']}: {tried[1]}"])  # fmt: skip
    headers = ["workload", "truth, cap (MiB)", "largest fit", "band top", "prediction", "answer",
               "trials before", "trials after"]  # fmt: skip
    said = (
        f"At most {after['target']} real trials on every case: {'met' if after['met'] else 'not met'} "
        f"(before: {'met' if before['met'] else 'not met'})."
    )
    return "\n\n".join([markdown(headers, lines, (0, 1, 6, 7)), said, provenance(before), provenance(after)])


def expandable_agreement_table(files: list[dict[str, Any]]) -> str:
    """``bench/expandable_agreement.py``: per row of the H200's expandable-segments file, the points
    the model agrees with on each model instance, its largest size, the H200's own contradictions
    and where the resident state must sit for the model to agree with the truth and the checks."""
    (data,) = files
    lines = []
    for row in data["rows"]:
        missed = [p for p in row["points"] if p["model"] != p["fits"]]
        disagree = "; ".join(
            f"{p['who']} {p['size']} x {p['steps']} ({'fits' if p['fits'] else 'fails'})" for p in missed
        )
        widest = row["contradictions"][0] if row["contradictions"] else None
        contradiction = (
            "-"
            if widest is None
            else (
                f"{len(row['contradictions'])}; widest: {widest[0]} {widest[1]} x {widest[2]} fits, "
                f"{widest[3]} {widest[4]} x {widest[5]} fails"
            )
        )
        largest = row["model_largest"]
        settled = [
            ", ".join(
                f"{s['cap_mib_from_row']:+d}: {'n/a' if s['largest'] is None else s['fails_at_step'] or '-'}"
                for s in row["settling"]
                if s["expandable"] == expandable
            )
            for expandable in (True, False)
        ]
        gaps = ", ".join(map(str, row["agreeing_gaps_mib"])) or "none"
        held = {f"{nbytes / 2**20:.1f}" for nbytes in row["unrecorded_bytes"].values() if nbytes}
        unrecorded = ", ".join(
            f"{who} {nbytes / 2**20:.1f}" for who, nbytes in row["unrecorded_bytes"].items() if nbytes
        )
        lines.append(
            [
                row["workload"],
                f"{row['cap_bytes'] / 2**20:.1f}",
                f"{row['agreeing']}/{len(row['points'])}",
                f"{row['judged_agreeing']}/{row['judged']}",
                f"{row['judged_agreeing_with_unrecorded']}/{row['judged']}" if held else "-",
                unrecorded or "-",
                disagree or "-",
                f"{largest['10']} / {largest['20']}",
                *settled,
                contradiction,
                gaps,
                str(row["largest_at_every_gap"] or "none"),
            ]
        )
    total = data["summary"]
    headers = ["workload", "cap (MiB)", "agree", "truth and checks agree"]
    headers += ["with what each instance held beyond the replay", "held beyond (MiB)"]
    headers += ["disagree at (H200's verdict)"]
    headers += ["model's largest (10 / 20 steps)", "its step of failure, by cap (MiB from the row's)"]
    headers += ["the same, default allocator", "H200 pairs no one start gives"]
    headers += ["offsets that agree with truth and checks (MiB)", "fits 20 steps at every offset"]
    said = (
        f"In all: {total['agreeing']} of {total['points']} points agree, {total['judged_agreeing']} of "
        f"{total['judged']} truth probes and checks ({total['judged_agreeing_with_unrecorded']} with "
        "what each instance held beyond the replay); the model's verdict at 20 steps differs from its "
        f"verdict at 10 at {total['steps_matter']} points; {total['contradictions']} pairs of the H200's "
        "verdicts on two instances cannot both come from one start. Replayed at caps around each row's for "
        f"up to {data['settling_steps']} steps, the largest size that trains 10 fails at step "
        f"{total['latest_failure_step']['True'] or '-'} at the latest with expandable segments, "
        f"{total['latest_failure_step']['False'] or 'never'} with the default allocator "
        "('-': it trains them all; n/a: no size within 16 of the model's answer at the row's cap trains 10)."
    )
    return f"{markdown(headers, lines, (0, 5, 6, 8, 9, 10, 11))}\n\n{said}\n\n{provenance(data)}"


def predict_trace_table(files: list[dict[str, Any]]) -> str:
    """``bench/predict_trace.py``: each workload's and mode's recording by a fake-tensor trace and by
    real trials on the CPU: their seconds, whether their requests are equal, and the answers of both."""
    lines = []
    for data in files:
        for row in data["rows"]:
            traced, trials = row["traced_answers"], row["trial_answers"]
            said = ", ".join(f"{target}: {answer}" for target, answer in traced.items())
            same = "-" if trials is None else ("yes" if trials == traced else "no")
            real = "-" if row["trial_seconds"] is None else f"{row['trial_seconds']:.1f}"
            equal = {True: "yes", False: "no", None: "-"}[row["equal"]]
            requests = "/".join(str(count) for count in row["requests"].values())
            lines.append([row["workload"], row["mode"], requests, f"{row['trace_seconds']:.1f}", real, equal,
                          said, same])  # fmt: skip
    headers = ["workload", "mode", "requests (2/4/8)", "trace s", "trials s", "requests equal",
               "answers (traced)", "trials' answers equal"]  # fmt: skip
    return markdown(headers, lines, (0, 1, 5, 6, 7)) + "\n\n" + "\n".join(provenance(f) for f in files)


def gpu_tests_run_table(files: list[dict[str, Any]]) -> str:
    """``bench/gpu_tests_run.py``: each GPU session's pytest log, the tests its command collected at
    its commit, how many ran and their outcomes; then the gpu tests no log shows passed."""
    (data,) = files
    lines = []
    for log in data["logs"]:
        tally = ", ".join(f"{count} {outcome}" for outcome, count in log["tally"].items())
        collected = str(len(log["collected"])) if log["commit"] else "- (named by its FAILED line)"
        lines.append(
            [f"`{log['log']}`", log["commit"] or "-", collected, str(sum(log["tally"].values())), tally]
        )
    headers = ["log", "commit", "gpu tests collected", "ran", "outcomes"]
    never = "\n".join(f"- `{node}`" for node in data["never_run"])
    said = (
        f"Never passed on a GPU, {len(data['never_run'])} of the {len(data['gpu_tests_now'])} gpu tests now:"
    )
    return f"{markdown(headers, lines, (0, 1, 4))}\n\n{said}\n\n{never}\n\n{provenance(data)}"


def transient_requests_table(files: list[dict[str, Any]]) -> str:
    """``bench/transient_requests.py``: per recorded CUDA trial, the requests freed before the next."""
    (data,) = files
    lines = [
        [
            row["workload"],
            str(row["batch_size"]),
            str(row["requests"]),
            str(row["transient"]),
            f"{row['largest_bytes'] / 2**20:.1f}",
            f"{row['total_bytes'] / 2**20:.0f}",
        ]
        for row in data["rows"]
    ]
    headers = [
        "workload",
        "batch",
        "requests (2 steps)",
        "freed before the next",
        "largest (MiB)",
        "in all (MiB)",
    ]
    return f"{markdown(headers, lines, (0,))}\n\n{provenance(data)}"


def source_block(paths: list[str]) -> str:
    """A source file of the repository, as a Python block."""
    (path,) = paths
    return f"```python\n{(ROOT / path).read_text().rstrip()}\n```"


#: KIND -> (renderer, whether it takes results files (else paths), whether it renders inline).
RENDERERS: dict[str, tuple[Callable[[Any], str], bool, bool]] = {
    "find": (find_table, True, False),
    "find-summary": (find_summary, True, True),
    "find-readings": (find_readings_table, True, False),
    "find-readings-summary": (find_readings_summary, True, True),
    "curves": (curves_table, True, False),
    "compare": (compare_table, True, False),
    "explore": (explore_table, True, False),
    "timings": (timings_table, True, False),
    "forecast-trained": (forecast_trained_table, True, False),
    "batch-schedule": (batch_schedule_table, True, False),
    "noise-prediction": (noise_prediction_table, True, False),
    "predict": (predict_table, True, False),
    "allocator-history": (allocator_history_table, True, False),
    "predict-histories": (predict_histories_table, True, False),
    "predict-trace": (predict_trace_table, True, False),
    "standin-agreement": (standin_agreement_table, True, False),
    "trials-replay": (trials_replay_table, True, False),
    "gpu-tests-run": (gpu_tests_run_table, True, False),
    "transient-requests": (transient_requests_table, True, False),
    "expandable-agreement": (expandable_agreement_table, True, False),
    "transcript": (transcript_block, True, False),
    "transcript-short": (functools.partial(transcript_block, short=True), True, False),
    "source": (source_block, False, False),
}


def render(spec: str) -> str:
    """The text a block of ``spec`` (``KIND FILE [FILE ...]``) holds, newlines around a block's."""
    kind, *paths = spec.split()
    if kind not in RENDERERS or not paths:
        kinds = ", ".join(RENDERERS)
        raise ValueError(f"a table is 'KIND FILE [FILE ...]' with KIND one of {kinds}: {spec!r}")
    renderer, reads, inline = RENDERERS[kind]
    text = renderer([load(path) for path in paths] if reads else paths)
    return text if inline else f"\n{text}\n"


def shown(path: Path) -> Path:
    """``path`` from the repository's root where it lies in it."""
    return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path


def documents() -> list[Path]:
    return [path for pattern in DOCUMENTS for path in sorted(ROOT.glob(pattern))]


def regenerate(text: str) -> str:
    return BLOCK.sub(lambda match: match[1] + render(match["spec"]) + match[4], text)


def stale(paths: Iterable[Path]) -> list[str]:
    """The blocks whose text differs from what their files give, as ``document: spec``."""
    found = []
    for path in paths:
        for match in BLOCK.finditer(path.read_text()):
            if match["body"] != render(match["spec"]):
                found.append(f"{shown(path)}: {match['spec']}")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only say which blocks differ (exit 1 if any)")
    args = parser.parse_args(argv)
    if args.check:
        found = stale(documents())
        for block in found:
            print(f"stale: {block}")
        return 1 if found else 0
    for path in documents():
        text = path.read_text()
        if (new := regenerate(text)) != text:
            path.write_text(new)
            print(f"rewrote {shown(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

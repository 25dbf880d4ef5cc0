"""The tables of the search's benches: bench/find.py's answers judged on their truth, the strict
readings of bench/find_readings.py, bench/find_curves.py's curves, bench/trials_replay.py's trials
and bench/forecast_trained.py's searches after a step."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from _readings import cell, read_row, said
from _tables_base import markdown, provenance
from _truth import CHECK_STEPS, TRUTH_STEPS, WINDOW, Curve, judge, spans

#: The largest answer each method of ``bench/find.py`` may give (its BOUNDS).
FIND_BOUNDS: dict[str, int | None] = {"batchfit": 512, "lightning": None, "accelerate": 512}


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

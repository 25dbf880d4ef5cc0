"""The tables of the memory prediction: bench/predict.py's predictions against the truth,
bench/predict_trace.py's traces against real trials and bench/standin_agreement.py's stand-in."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from _tables_base import markdown, provenance
from _truth import TRUTH_STEPS, Curve, spans


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

"""The CUDA stand-in checked against CUDA: batchfit's model of the caching allocator, driven by the
H200's recorded requests (``bench/allocator_history.py``'s trials at 2, 4 and 8, each request's
size on the line through them, as ``predict`` replays them), says fit or fail at every size the
H200's truth probed, for the truth's steps under the cap the truth ran at (the per-process memory
fraction: every segment the process holds counts, the resident ones too). Each size's verdict is
set beside the truth's, and each edge of the truth's bands (a size that fits beside one that fails)
beside the model's nearest edge of the same kind.

The truths: the scans of ``bench/find.py`` on the H200 (``find-cuda-smoke-builtins.json``: every
size around the answer, 10 steps each) and, for ResNet-50 and the first session's other rows, its
boundary checks (``true_max`` fits, the ``first_failure`` above it fails). Rows with
``cudnn.benchmark`` on are left out: the histories were recorded with it off.

Run (CPU only, about a second): ``python bench/standin_agreement.py [--json F]``.
"""

from __future__ import annotations

import ast
import json
import sys
import time
from dataclasses import dataclass
from typing import Any

import _harness
import _histories

from batchfit.policy.capacity.capacity_prediction import CapacityPredictor
from batchfit.runtime.devices.cuda import CudaDevice

#: The H200's truths, the scan first: a workload and cap in both is judged on each.
TRUTHS = (
    "bench/data/h200-2026-11-26-2/find-cuda-smoke-builtins.json",
    "bench/data/h200-2026-11-26/find-cuda-resnet50-amp-resnet50-mlp-cnn-transformer.json",
)
#: Steps a truth probe trains (``_truth.TRUTH_STEPS``, and the first session's ``find.py``'s).
TRUTH_STEPS = 10
#: What the model is asked to reach: the share of sizes that agree, and how far (in samples) each
#: truth edge may lie from the model's nearest.
TARGET_AGREEMENT, TARGET_EDGE = 0.95, 1
#: How far past the probed sizes the model is played to find its nearest edges.
MARGIN = 16


@dataclass(frozen=True)
class Edge:
    """Where the verdict changes between ``size`` and ``size + 1``: ``falling`` from fit to fail."""

    size: int
    falling: bool

    def __str__(self) -> str:
        return f"{'fails' if self.falling else 'fits'} from {self.size + 1}"


def truth_points(row: dict[str, Any]) -> tuple[str, dict[int, bool]]:
    """A truth row's kind (``scan`` or ``boundary``) and its verdict at each size it probed. A
    boundary check names the sizes whose peaks it kept and its ``true_max`` as fitting, and its
    ``first_failure`` as failing where it probed more sizes than fitted (a ``true_max`` at the
    search's upper bound probed nothing above it)."""
    truth = row["truth"]
    if "fits" in truth:
        return "scan", {int(size): fit for size, fit in truth["fits"].items()}
    points = {int(size): True for size in truth.get("peaks", {})} | {int(truth["true_max"]): True}
    if truth["probes"] > len(points) and truth["first_failure"] is not None:
        points[int(truth["first_failure"])] = False
    return "boundary", points


def edges(points: dict[int, bool]) -> list[Edge]:
    """The edges between neighbouring probed sizes (consecutive integers) whose verdicts differ."""
    return [
        Edge(size, points[size])
        for size in sorted(points)
        if size + 1 in points and points[size] != points[size + 1]
    ]


def nearest(edge: Edge, others: list[Edge]) -> Edge | None:
    """The edge of ``others`` of ``edge``'s kind nearest to it (None: none)."""
    alike = [other for other in others if other.falling == edge.falling]
    return min(alike, key=lambda other: (abs(other.size - edge.size), other.size), default=None)


def predictor(workload: str) -> CapacityPredictor:
    """``predict``'s replay of the H200's recorded trials of ``workload``: the pair its forecast
    takes, their requests on lines in the batch, workspaces soft as cuDNN's are on CUDA."""
    histories = _histories.histories(workload)
    records = {size: _histories.record_of(history) for size, history in histories.items()}
    return CapacityPredictor(records, TRUTH_STEPS, CudaDevice.soft_workspaces)


def agreement(path: str, row: dict[str, Any]) -> dict[str, Any]:
    """One truth row against the model: every probed size's two verdicts, the edges, the counts."""
    kind, truth = truth_points(row)
    workload, cap = row["case"]["workload"], int(row["cap_bytes"])
    replay = predictor(workload)
    began = time.perf_counter()
    low, high = min(truth), max(truth)
    model = {size: replay.play(size, cap).fits for size in range(max(1, low - MARGIN), high + MARGIN + 1)}
    seconds = time.perf_counter() - began
    judged = []
    for edge in edges(truth):
        found = nearest(edge, edges(model))
        off = None if found is None else abs(found.size - edge.size)
        judged.append({"truth": str(edge), "model": None if found is None else str(found), "off": off})
    agreeing = [size for size in truth if model[size] == truth[size]]
    return {
        "workload": workload,
        "cap_bytes": cap,
        "truth_file": path,
        "truth_kind": kind,
        "pair": list(replay.replays[0][0]),
        "sizes": {str(size): {"truth": truth[size], "model": model[size]} for size in sorted(truth)},
        "scanned": len(truth),
        "agreeing": len(agreeing),
        "edges": judged,
        "replay_seconds": seconds,
        "replays": len(model),
    }


def rows(truths: tuple[str, ...] = TRUTHS) -> list[dict[str, Any]]:
    """Every truth row whose workload has recorded histories and ran without ``cudnn.benchmark``."""
    found = []
    for path in truths:
        for row in json.loads((_harness.ROOT / path).read_text())["rows"]:
            case = row["case"]
            if isinstance(case, str):  # the first session's files hold the case as its repr
                case = row["case"] = ast.literal_eval(case)
            if case["workload"] in _histories.WORKLOADS and not case["cudnn_benchmark"]:
                found.append(agreement(path, row))
    return found


def summary(found: list[dict[str, Any]]) -> dict[str, Any]:
    """The counts over every row, and whether the target is met."""
    scanned = sum(row["scanned"] for row in found)
    agreeing = sum(row["agreeing"] for row in found)
    offs = [edge["off"] for row in found for edge in row["edges"]]
    within = sum(1 for off in offs if off is not None and off <= TARGET_EDGE)
    met = agreeing >= TARGET_AGREEMENT * scanned and within == len(offs)
    return {"scanned": scanned, "agreeing": agreeing, "edges": len(offs), "edges_within": within, "met": met}


def main(argv: list[str] | None = None) -> int:
    args, session = _harness.start(
        __doc__,
        argv,
        quick="the same (it takes about a second)",
        json_default="bench/results/standin-agreement.json",
    )
    found = rows()
    for row in found:
        missed = [size for size, verdicts in row["sizes"].items() if verdicts["truth"] != verdicts["model"]]
        print(
            f"  {row['workload']} ({row['truth_kind']}, {row['cap_bytes']} bytes): "
            f"{row['agreeing']}/{row['scanned']} agree; disagree at {', '.join(missed) or 'none'}"
        )
        for edge in row["edges"]:
            print(f"    edge {edge['truth']}: model {edge['model']} (off by {edge['off']})")
    total = summary(found)
    payload = {"histories": _histories.recorded(), "truths": list(TRUTHS), "steps": TRUTH_STEPS}
    payload |= {"target": {"agreement": TARGET_AGREEMENT, "edge": TARGET_EDGE}}
    _harness.save(
        args,
        session,
        _harness.RESULTS / "standin-agreement.json",
        payload | {"rows": found, "summary": total},
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

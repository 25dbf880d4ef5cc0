"""The model of expandable segments checked against the H200: batchfit's model of the caching
allocator with ``expandable_segments:True`` (``policy.allocator.expandable_segments``), driven by the H200's
recorded requests (``bench/allocator_history.py``'s default-allocator trials at 2, 4 and 8, each
request's size on the line through them, as ``predict`` replays them; the requests a step makes do
not depend on the allocator), says fit or fail at every point the H200 recorded with the setting
(``find-cuda-expandable-*.json``), at that point's steps under its cap, and at 20 steps beside.

The points: the truth's bisection (10 steps a probe: the sizes it kept fitting, the first failure
above them), each method's 20-step check of its answer, and each method's own trials (batchfit's
opening at 2 steps, its later trials at 10; Lightning's and accelerate's at 2). Every method, probe
and check ran on a model built anew, in turn, in one process: the model starts from a fresh
process's resident state (``_histories.expandable_record_of``), and also from the same state a
few MiB into the large pool's first page (``GAPS``), where a model built after others may sit.

Run (CPU only, about a minute): ``python bench/expandable_agreement.py [--json F]``.
"""

from __future__ import annotations

import ast
import json
import sys
from collections import Counter
from typing import Any

import _harness
import _histories

from batchfit.policy.allocator.allocation_replay import AllocationReplay
from batchfit.policy.capacity.capacity_prediction import CapacityPredictor
from batchfit.runtime.devices.cuda import CudaDevice

TRUTH = "bench/data/h200-2026-11-26/find-cuda-expandable-cnn-transformer-mlp-resnet50-amp.json"
#: Steps of a truth probe, of a check, of a competitor's trial and of batchfit's opening trials in
#: that session (its ``find.py``'s ``TRUTH_STEPS``, ``CONFIRM_STEPS``, ``STEPS_PER_TRIAL``), and of
#: batchfit's trials after its opening (``confirm_steps`` on CUDA).
TRUTH_STEPS, CHECK_STEPS, TRIAL_STEPS, CONFIRM_STEPS = 10, 20, 2, 10
STEPS = (TRIAL_STEPS, TRUTH_STEPS, CHECK_STEPS)
#: Where the large pool's resident state may begin in its first page, in MiB (0: at its start).
GAPS = tuple(range(0, 20, 2))
#: How far around each recorded size the model is played for its own largest fitting size.
MARGIN = 8
#: The caps around each row's at which the model's settling is read, in MiB from the row's, and
#: the most steps it is played for.
SETTLING_CAPS_MIB, SETTLING_STEPS = (-40, -20, 0, 20, 40), 100


def points(row: dict[str, Any]) -> list[dict[str, Any]]:
    """Every recorded verdict of a row: who ran it, the size, its steps and whether it fitted."""
    found = []
    truth = row["truth"]
    fitted = {int(size) for size in truth["peaks"]} | ({truth["true_max"]} - {None})
    found += [{"who": "truth", "size": size, "steps": TRUTH_STEPS, "fits": True} for size in sorted(fitted)]
    if truth["first_failure"] is not None and truth["probes"] > len(fitted):
        found.append({"who": "truth", "size": truth["first_failure"], "steps": TRUTH_STEPS, "fits": False})
    methods = {"batchfit": row["batchfit"]} | {k: v for k, v in row["competitors"].items() if v}
    for name, method in methods.items():
        for index, size in enumerate(dict.fromkeys(method["sizes"])):
            steps = TRIAL_STEPS if name != "batchfit" or index < 2 else CONFIRM_STEPS
            fits = str(size) in method["peaks"]
            found.append({"who": f"{name} trial", "size": size, "steps": steps, "fits": fits})
        if method["trains"] is not None:
            check = {"who": f"{name} check", "size": method["answer"], "steps": CHECK_STEPS}
            found.append(check | {"fits": method["trains"]})
    return found


def predictors(workload: str, gap_mib: int, held_bytes: int = 0) -> dict[int, CapacityPredictor]:
    """``predict``'s replay of the H200's recorded trials of ``workload`` on expandable segments,
    the large pool's resident state ``gap_mib`` into its first page (and ``held_bytes`` more held
    after it), at each of ``STEPS``."""
    histories = _histories.histories(workload)
    records = {
        size: _histories.expandable_record_of(h, gap_mib << 20, held_bytes) for size, h in histories.items()
    }
    return {steps: CapacityPredictor(records, steps, CudaDevice.soft_workspaces) for steps in STEPS}


def agreement(row: dict[str, Any]) -> dict[str, Any]:
    """One recorded row against the model: each point's verdicts, the model's largest fitting
    size near them, and the gaps under which it agrees with every truth and check point."""
    workload, cap = row["case"]["workload"], int(row["cap_bytes"])
    found = points(row)
    by_gap = {gap: predictors(workload, gap) for gap in GAPS}
    fresh = by_gap[0]
    for point in found:
        played = fresh[point["steps"]].play(point["size"], cap)
        point["model"] = played.fits
        point["model_at_20"] = fresh[CHECK_STEPS].play(point["size"], cap).fits
        recorded = row_peak(row, point)
        point["peak_allocated_bytes"] = recorded
        point["model_peak_allocated_bytes"] = None if recorded is None else played.peak_allocated_bytes
    judged = [point for point in found if point["who"] == "truth" or point["who"].endswith("check")]
    agreeing_gaps = [
        gap
        for gap, replay in by_gap.items()
        if all(replay[p["steps"]].play(p["size"], cap).fits == p["fits"] for p in judged)
    ]
    window = sorted({s for p in found for s in range(max(1, p["size"] - MARGIN), p["size"] + MARGIN + 1)})
    largest = {
        str(steps): max((s for s in window if fresh[steps].play(s, cap).fits), default=None)
        for steps in (TRUTH_STEPS, CHECK_STEPS)
    }
    unrecorded = {who: unrecorded_bytes(found, who) for who in dict.fromkeys(instance(p) for p in found)}
    held = {
        nbytes: predictors(workload, 0, nbytes) if nbytes else fresh for nbytes in set(unrecorded.values())
    }
    for point in found:
        replay = held[unrecorded[instance(point)]]
        point["model_with_unrecorded"] = replay[point["steps"]].play(point["size"], cap).fits
    robust = [s for s in window if all(replay[CHECK_STEPS].play(s, cap).fits for replay in by_gap.values())]
    return {
        "workload": workload,
        "cap_bytes": cap,
        "pair": list(fresh[TRUTH_STEPS].replays[0][0]),
        "points": found,
        "agreeing": sum(p["model"] == p["fits"] for p in found),
        "judged": len(judged),
        "judged_agreeing": sum(p["model"] == p["fits"] for p in judged),
        "by_instance": by_instance(found),
        "steps_matter": [
            p["size"] for p in found if p["model_at_20"] != fresh[TRUTH_STEPS].play(p["size"], cap).fits
        ],
        "model_largest": largest,
        "agreeing_gaps_mib": agreeing_gaps,
        "largest_at_every_gap": max(robust, default=None),
        "unrecorded_bytes": unrecorded,
        "judged_agreeing_with_unrecorded": sum(p["model_with_unrecorded"] == p["fits"] for p in judged),
        "contradictions": contradictions(found),
        "settling": settling(workload, cap, largest[str(TRUTH_STEPS)] or MARGIN),
    }


def instance(point: dict[str, Any]) -> str:
    """The model instance a point ran on: the truth's, a method's trials', or a method's check's
    (``find.py`` built each anew)."""
    return str(point["who"])


def unrecorded_bytes(found: list[dict[str, Any]], who: str) -> int:
    """What instance ``who``'s trials held at their peaks beyond the replay's, where they held
    more: the most common difference of its recorded allocated peaks and the model's (0 where that
    is not above 0, or it kept no peak)."""
    differences = Counter(
        p["peak_allocated_bytes"] - p["model_peak_allocated_bytes"]
        for p in found
        if p["who"] == who and p["peak_allocated_bytes"] is not None
    )
    common = differences.most_common(1)
    return max(0, common[0][0]) if common else 0


def by_instance(found: list[dict[str, Any]]) -> dict[str, list[int]]:
    """For each model instance the H200 ran on (the truth's, each method's), the points the model
    agrees with and the points recorded on it."""
    counts: dict[str, list[int]] = {}
    for point in found:
        count = counts.setdefault(point["who"], [0, 0])
        count[0] += point["model"] == point["fits"]
        count[1] += 1
    return counts


def contradictions(found: list[dict[str, Any]]) -> list[list[Any]]:
    """Pairs of H200 verdicts on two model instances that no one start can give: one fitted a size
    for some steps, the other failed a size no larger for no more steps; each ``[who, size, steps]``
    of the fitting one, then of the failing one, the widest first."""
    pairs = [
        [p["who"], p["size"], p["steps"], q["who"], q["size"], q["steps"]]
        for p in found
        for q in found
        if p["fits"]
        and not q["fits"]
        and q["size"] <= p["size"]
        and q["steps"] <= p["steps"]
        and instance(p) != instance(q)
    ]
    return sorted(pairs, key=lambda pair: (pair[4] - pair[1], pair[5] - pair[2]))


def settling(workload: str, cap: int, near: int) -> list[dict[str, Any]]:
    """At caps around ``cap``, with each allocator: the model's largest size near ``near`` that
    trains ``TRUTH_STEPS`` steps, and the step count at which it first fails within
    ``SETTLING_STEPS`` (None: it trains them all, its state recurring)."""
    histories = _histories.histories(workload)
    found = []
    for expandable in (False, True):
        make = _histories.expandable_record_of if expandable else _histories.record_of
        records = {size: make(history) for size, history in histories.items()}
        replay = CapacityPredictor(records, TRUTH_STEPS, CudaDevice.soft_workspaces).replays[0][1]

        def fits(size: int, limit: int, steps: int, replay: AllocationReplay = replay) -> bool:
            return bool(replay.fits(size, limit, steps, CudaDevice.soft_workspaces))

        for offset in SETTLING_CAPS_MIB:
            limit = cap + (offset << 20)
            window = range(max(1, near - 2 * MARGIN), near + 2 * MARGIN + 1)
            largest = max((size for size in window if fits(size, limit, TRUTH_STEPS)), default=None)
            first = None
            if largest is not None and not fits(largest, limit, SETTLING_STEPS):
                placed, failed = TRUTH_STEPS, SETTLING_STEPS  # fits at placed, fails at failed
                while failed - placed > 1:
                    middle = (placed + failed) // 2
                    placed, failed = (middle, failed) if fits(largest, limit, middle) else (placed, middle)
                first = failed
            found.append(
                {
                    "expandable": expandable,
                    "cap_mib_from_row": offset,
                    "largest": largest,
                    "fails_at_step": first,
                }
            )
    return found


def row_peak(row: dict[str, Any], point: dict[str, Any]) -> int | None:
    """The allocated peak the H200 recorded at a fitting truth probe or trial (None: none kept; a
    check keeps none)."""
    who = point["who"].split()[0]
    if not point["fits"] or point["who"].endswith("check"):
        return None
    method = (
        row["truth"] if who == "truth" else row["batchfit"] if who == "batchfit" else row["competitors"][who]
    )
    value = method["peaks"].get(str(point["size"]))
    return None if value is None else int(value)


def rows(path: str = TRUTH) -> list[dict[str, Any]]:
    found = []
    for row in json.loads((_harness.ROOT / path).read_text())["rows"]:
        if isinstance(row["case"], str):  # the first session's files hold the case as its repr
            row["case"] = ast.literal_eval(row["case"])
        found.append(agreement(row))
    return found


def summary(found: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "points": sum(len(row["points"]) for row in found),
        "agreeing": sum(row["agreeing"] for row in found),
        "judged": sum(row["judged"] for row in found),
        "judged_agreeing": sum(row["judged_agreeing"] for row in found),
        "judged_agreeing_with_unrecorded": sum(row["judged_agreeing_with_unrecorded"] for row in found),
        "steps_matter": sum(len(row["steps_matter"]) for row in found),
        "contradictions": sum(len(row["contradictions"]) for row in found),
        "latest_failure_step": {
            str(kind): max(
                (
                    s["fails_at_step"] or 0
                    for row in found
                    for s in row["settling"]
                    if s["expandable"] == kind
                ),
                default=0,
            )
            for kind in (False, True)
        },
    }


def main(argv: list[str] | None = None) -> int:
    args, session = _harness.start(
        __doc__,
        argv,
        quick="the same (about a minute)",
        json_default="bench/results/expandable-agreement.json",
    )
    found = rows()
    for row in found:
        print(f"  {row['workload']} ({row['cap_bytes']} bytes): {row['agreeing']}/{len(row['points'])} agree")
        for point in row["points"]:
            print(
                f"    {point['who']:<18} {point['size']:>4} x {point['steps']:>2} steps: "
                f"H200 {'fits' if point['fits'] else 'fails'}, model {'fits' if point['model'] else 'fails'}"
            )
        print(f"    model's largest {row['model_largest']}; agrees at gaps {row['agreeing_gaps_mib']} MiB")
    total = summary(found)
    print(total)
    payload: dict[str, Any] = {"histories": _histories.recorded(), "truth": TRUTH, "gaps_mib": list(GAPS)}
    payload |= {"settling_steps": SETTLING_STEPS, "rows": found, "summary": total}
    _harness.save(args, session, _harness.RESULTS / "expandable-agreement.json", payload)
    return 0


if __name__ == "__main__":
    sys.exit(main())

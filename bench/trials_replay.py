"""``find``'s search from a saved prediction (``start_from``), on the H200's recorded truth replayed
as a device: how many real trials it takes on each case, beside the truth's largest fitting size.

The device answers a trial at batch ``b`` from the recorded truth: the H200's scans
(``find-cuda-smoke-builtins.json``: fit or fail at every size, 10 steps) and, for a workload and cap
no scan covers, the first session's boundary checks (``true_max`` fits, ``first_failure`` fails),
as ``bench/standin_agreement.py`` reads them. A size the truth did not probe is taken to fit below
its probed sizes and to fail above them (memory grows with the batch), and is counted as modelled.
Every trial answers with the truth's 10-step verdict, the opening's short trials too. Its
measurements (peaks, and for a trial that fits the allocator record the search's replay pairs
with) come from the line through the H200's recorded trials, as ``predict``'s replay plays them
(``_histories.record_of``, ``policy.allocator.allocation_replay``).

The search is ``batchfit.policy.search.search.search_and_confirm`` then
``policy.search.safe_band.hold_below``, as
``find`` runs them on CUDA: the seed is the saved prediction's answer (``StartingEvidence.placed``:
the recorded trials' replay at the cap, over the 10 confirming steps, lowered to the top of the band
below it that holds every size from the truth's smallest probed one), the forecast the replay of the
prediction's records joined by the records of the trials that fit, every trial after the seed the
confirming one; the check below the answer (from the truth's smallest probed size) runs its real
trials where the replay decides something, and they count. The summary line
is ``SearchResult``'s account of the trials (``policy.search.search_account``).

Run (CPU only, a few seconds): ``python bench/trials_replay.py [--json F]``.
"""

from __future__ import annotations

import ast
import json
import math
import sys
from dataclasses import dataclass, field
from typing import Any

import _harness
import _histories
import standin_agreement

from batchfit.policy.allocator.allocation_record import ALLOC, AllocationRecord
from batchfit.policy.allocator.allocation_replay import AllocationReplay
from batchfit.policy.capacity.capacity_prediction import CapacityPredictor
from batchfit.policy.search.replay_forecast import ReplayForecast
from batchfit.policy.search.safe_band import Under, hold_below
from batchfit.policy.search.search import Candidates, Predicted, SearchOutcome, search_and_confirm
from batchfit.policy.search.search_account import trials_account
from batchfit.policy.search.trial import Trial
from batchfit.policy.search.trial_records import TrialRecords
from batchfit.search.starting_evidence import StartingEvidence

#: find's defaults on CUDA: the opening's steps and the confirming trial's (the truth's too).
OPENING_STEPS, CONFIRM_STEPS = 2, standin_agreement.TRUTH_STEPS
#: The bound the scans and the first session's searches ran under.
MAX_BATCH_SIZE = 512
#: What issue 52 asks: the answer placed in at most this many real trials on each case.
TARGET = 3


@dataclass
class ReplayedDevice:
    """One case's truth as a device: a trial's verdict from the truth, its measurements from the
    replay of the recorded trials; the records of the trials that fitted, as find's runners fill them."""

    truth: dict[int, bool]
    cap_bytes: int
    replay: AllocationReplay
    records: TrialRecords  # the search's: the replay forecast reads them
    modelled: set[int] = field(default_factory=set)  # sizes the truth did not probe

    def fits(self, batch_size: int) -> bool:
        if batch_size in self.truth:
            return self.truth[batch_size]
        self.modelled.add(batch_size)
        return batch_size < min(self.truth)

    def trial(self, batch_size: int, steps: int) -> Trial:
        played = self.replay.play(batch_size, self.cap_bytes, CONFIRM_STEPS, soft_workspaces=True)
        if played is None:
            raise ValueError(f"the records cannot be played for {CONFIRM_STEPS} steps")
        fits = self.fits(batch_size)
        if fits:
            self.records.add(self.record_at(batch_size))
        return Trial(
            batch_size,
            "ok" if fits else "oom",
            played.peak_allocated_bytes,
            None,
            reserved_peak_bytes=played.peak_reserved_bytes,
            steps=steps,
        )

    def record_at(self, batch_size: int) -> AllocationRecord:
        """The requests of a trial at ``batch_size``: each on its line through the recorded trials."""
        sizes = iter(max(1, math.ceil(fixed + slope * batch_size)) for fixed, slope in self.replay.lines)
        steps = tuple(
            tuple((kind, next(sizes)) if kind == ALLOC else (kind, value) for kind, value in events)
            for events in self.replay.steps
        )
        return AllocationRecord(
            batch_size, self.replay.start, steps, self.replay.expandable, self.replay.places
        )


def cases() -> list[tuple[str, int, str, str, dict[int, bool]]]:
    """(workload, cap, truth kind, truth file, truth) for each scan, and each boundary check whose
    workload and cap no scan covers."""
    found: list[tuple[str, int, str, str, dict[int, bool]]] = []
    for path in standin_agreement.TRUTHS:
        for row in json.loads((_harness.ROOT / path).read_text())["rows"]:
            case = row["case"]
            case = ast.literal_eval(case) if isinstance(case, str) else case
            workload, cap = case["workload"], int(row["cap_bytes"])
            if workload not in _histories.WORKLOADS or case["cudnn_benchmark"]:
                continue
            kind, truth = standin_agreement.truth_points(row)
            if all((workload, cap) != (other[0], other[1]) for other in found):
                found.append((workload, cap, kind, path, truth))
    return found


def replay_case(
    workload: str, cap: int, truth: dict[int, bool]
) -> tuple[int | None, SearchOutcome, set[int]]:
    """The saved prediction's seed, the search's outcome from it with the check below its answer
    (as ``find`` runs it), and the sizes it tried that the truth did not probe. The band is checked
    from the truth's smallest probed size: below it the H200 measured nothing."""
    histories = _histories.histories(workload)
    recorded = {size: _histories.record_of(history) for size, history in histories.items()}
    candidates = Candidates.between(1, MAX_BATCH_SIZE)
    evidence = StartingEvidence(recorded, cpu_alone=False, source=f"the H200's {workload} histories")
    low = min(truth)
    seed = evidence.placed(cap, CONFIRM_STEPS, candidates, soft_workspaces=True, foreign=False, low=low)
    replay = CapacityPredictor(recorded, CONFIRM_STEPS, True).replays[0][1]
    device = ReplayedDevice(truth, cap, replay, TrialRecords(recorded))
    forecast = ReplayForecast(device.records, cap, CONFIRM_STEPS, soft_workspaces=True, low=low)
    outcome = search_and_confirm(
        lambda batch: device.trial(batch, OPENING_STEPS),
        candidates,
        cap,
        predicted=Predicted(seed=seed),
        longer=lambda batch: device.trial(batch, CONFIRM_STEPS),
        forecast=forecast,
    )
    if outcome.batch_size is None:
        return seed, outcome, device.modelled
    longer = lambda batch: device.trial(batch, CONFIRM_STEPS)  # noqa: E731
    band, ran = hold_below(
        outcome.batch_size,
        low,
        candidates,
        outcome.trials,
        longer,
        forecast.play,
        Under(cap, cap, CONFIRM_STEPS),
    )
    answer = outcome.batch_size if band.high is None else band.high
    reason = outcome.stop_reason if answer == outcome.batch_size else "smaller_size_failed"
    trials = outcome.trials + ran
    return (
        seed,
        SearchOutcome(answer, trials, outcome.memory_model, reason, outcome.confirmed),
        device.modelled,
    )


def band_top(truth: dict[int, bool]) -> int | None:
    """The top of the band that holds every probed size from the smallest up (None: it fails)."""
    top = None
    for size in sorted(truth):
        if not truth[size]:
            break
        top = size
    return top


def rows() -> list[dict[str, Any]]:
    found = []
    for workload, cap, kind, path, truth in cases():
        seed, outcome, modelled = replay_case(workload, cap, truth)
        largest = max((size for size, fits in truth.items() if fits and size <= MAX_BATCH_SIZE), default=None)
        found.append(
            {
                "workload": workload,
                "cap_bytes": cap,
                "truth_kind": kind,
                "truth_file": path,
                "truth_largest": largest,
                "truth_band_top": band_top(truth),
                "seed": seed,
                "answer": outcome.batch_size,
                "stop_reason": outcome.stop_reason,
                "real_trials": len(outcome.trials),
                "trials": [[t.batch_size, t.steps, t.outcome] for t in outcome.trials],
                "modelled": sorted(modelled & {t.batch_size for t in outcome.trials}),
                "account": trials_account(outcome.trials, outcome.batch_size, seed),
            }
        )
    return found


def main(argv: list[str] | None = None) -> int:
    args, session = _harness.start(
        __doc__,
        argv,
        quick="the same (it takes a few seconds)",
        json_default="bench/results/trials-replay.json",
    )
    found = rows()
    headers = ("workload", "cap", "truth", "largest fit", "band top", "seed", "answer", "trials", "sizes")
    lines = [
        [
            row["workload"],
            str(row["cap_bytes"]),
            row["truth_kind"],
            str(row["truth_largest"]),
            str(row["truth_band_top"]),
            str(row["seed"]),
            str(row["answer"]),
            str(row["real_trials"]),
            " ".join(f"{size}{'' if outcome == 'ok' else 'x'}" for size, _, outcome in row["trials"]),
        ]
        for row in found
    ]
    _harness.print_text_table(headers, lines)
    for row in found:
        print(f"  {row['workload']}: {row['account']}")
    met = all(row["real_trials"] <= TARGET for row in found)
    print(f"\nat most {TARGET} real trials on every case: {'met' if met else 'NOT met'} (x: out of memory)")
    payload: dict[str, Any] = {
        "truths": list(standin_agreement.TRUTHS),
        "histories": str(_histories.HISTORIES.relative_to(_harness.ROOT)),
    }
    payload |= {"opening_steps": OPENING_STEPS, "confirm_steps": CONFIRM_STEPS, "target": TARGET}
    _harness.save(
        args, session, _harness.RESULTS / "trials-replay.json", payload | {"rows": found, "met": met}
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

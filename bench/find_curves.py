"""Record the trials ``find`` can run on each of ``bench/find.py``'s cases, for ``bench/find_replay.py``.

For each case this runs batchfit's own capped trial (``TrialRunner``: the cache emptied first, the
steps under the cap, the state put back after) at every batch size that matters to a search, each
from the workload's resident state, and writes each trial's outcome, allocated and reserved peaks
and allocator retries:

- the sizes 1, 2, 3, 4, 6, 8, 12, ... (powers of two and their midpoints) up to ``MAX_BATCH_SIZE``,
  and every size from 0.85x to 1.12x the largest that fits (found first by galloping and
  bisecting), each with the seconds its trial took, set-up and clean-up included;
- on a caching allocator, each fitting size from 0.85x up is also run as the trial that confirms
  an answer there (``CONFIRM_STEPS``, 10 steps, ended early where the allocator's state recurs,
  as ``find`` runs it: the caching allocator fragments over the first steps);
- on a caching allocator, the allocator's requests in the trials of the opening's sizes (up to
  4), step by step, which ``find`` replays at other sizes to place its confirming trials
  (``policy.allocator.allocation_replay``), and those of each confirming trial that fitted (its first
  ``STEPS_PER_TRIAL`` steps, which the replay pairs with the opening's): ``find`` asks the replay
  again on such a record where its first answer failed;
- ``find_batch_size`` itself, once, from a fresh workload: its trials, for the replay to check
  itself against (on the CPU its fake-tensor forecast places them, which the replay does not model).

Search policies can then be compared offline, on any machine, against trials a real device ran:
the data of a GPU session is recorded once and tuned on afterwards. It assumes what ``find``
assumes: a trial's outcome depends on its batch size, not on what ran before it.

Run: ``.venv/bin/python bench/find_curves.py [--device cuda] [--quick] [--workloads cnn,mlp]``
(on the 2-core CPU 45 s, ``--quick`` 11 s; on an H100 the cnn and the transformer 16 s, ResNet-50
AMP 110 s: ``bench/data/h100-2026-11-25/``), written to
``bench/results/find-curves-DEVICE.json``.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import _harness
import _workloads
import torch
from _capped import MAX_BATCH_SIZE, STEPS_PER_TRIAL, Bench, Case, bench_device
from find import PACKAGES, prepared, select_cases

from batchfit import Workload
from batchfit.policy.search.trial import Trial
from batchfit.runtime.devices.device import Device
from batchfit.runtime.devices.tracker import resident_tensors
from batchfit.runtime.steps.runner import TrialRunner
from batchfit.runtime.steps.state import TrainingSnapshot
from batchfit.units import format_bytes

#: The window around the largest fitting size where every size is recorded, as fractions of it:
#: where a search's guesses, overshoots and confirmation land (on the H100 its first guesses were
#: 0.97x-1.07x the truth). Sizes outside it are interpolated by the replay.
DENSE_BELOW, DENSE_ABOVE = 0.85, 1.12
#: The sizes whose allocator requests are kept: the search's opening (2 and 4) and below.
OPENING = 4


@dataclass
class Point:
    """One batch size: its trial of ``steps_per_trial`` steps and, where recorded, its longer one."""

    batch_size: int
    short: dict[str, Any]
    long: dict[str, Any] | None = None
    short_seconds: float = 0.0  # the whole trial's wall time: release, steps, restore
    long_seconds: float | None = None


@dataclass
class Curve:
    """One case's recorded trials, and what ``find_batch_size`` did on it."""

    workload: str
    name: str
    cap: str
    cap_bytes: int
    budget_bytes: int
    steps_per_trial: int
    confirm_steps: int | None
    max_batch_size: int
    largest_fitting: int | None  # by the short trials
    points: list[Point] = field(default_factory=list)
    find_sizes: list[int] = field(default_factory=list)  # find_batch_size's search's real trials, in order
    find_steps: list[int | None] = field(default_factory=list)  # the steps each of those ran
    find_answer: int | None = None
    # The real trials of find's check of the band below its answer (``SearchResult.band``), after
    # the search's: the replay (``find_replay.py``) replays the search, not the check.
    find_band: list[int] = field(default_factory=list)
    find_traces: int = 0  # its fake-tensor traces (the CPU's forecast)
    seconds: float = 0.0
    # On a caching allocator, the allocator requests of the opening's sizes
    # (policy.allocator.allocation_replay).
    records: dict[str, dict[str, Any]] = field(default_factory=dict)
    # The same of each confirming trial that fitted (near the boundary), cut to the opening's steps.
    near_records: dict[str, dict[str, Any]] = field(default_factory=dict)
    soft_workspaces: bool = False  # the device's kernels do without a workspace that does not fit


def largest_fitting(fits: Callable[[int], bool], start: int, upper: int) -> tuple[int | None, int]:
    """The largest batch in [1, upper] that ``fits``, and the smallest that does not (upper + 1 if
    none), assuming memory grows with the batch: gallop from ``start`` to a fitting and a failing
    size, then bisect between them. It locates where to record densely; it judges nothing (the
    benchmarks' truth is ``_truth.scan``, which assumes no such thing)."""
    step = 1
    if fits(start):
        low = start
        while True:  # up until a size fails
            if low == upper:
                return low, upper + 1
            candidate = min(upper, low + step)
            if not fits(candidate):
                high = candidate
                break
            low, step = candidate, 2 * step
    else:
        high = start
        while True:  # down until a size fits
            if high == 1:
                return None, 1
            candidate = max(1, high - step)
            if fits(candidate):
                low = candidate
                break
            high, step = candidate, 2 * step
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low, high


def grid(upper: int) -> list[int]:
    """1, 2, 3, 4, 6, 8, 12, 16, ...: powers of two and the midpoints between them, up to ``upper``."""
    sizes = {1}
    power = 1
    while power <= upper:
        sizes.update(s for s in (power, power + power // 2) if s <= upper)
        power *= 2
    return sorted(sizes)


def record(case: Case, device: torch.device, kind: str | None = None) -> Curve:
    bench = prepared(case, device, kind)
    workload, state = bench.workload()
    target = bench.target(bench.cap_bytes)
    started = time.perf_counter()
    snapshot = TrainingSnapshot.capture(
        workload.model, state.optimizer, (workload.train_step, workload.eval_step)
    )
    snapshot.set_gradients_aside()
    try:
        budget = target.capacity_bytes(resident_tensors(workload.model, state.optimizer))
        short, longer = _runners(workload, target, budget, snapshot)
        confirm_steps = target.confirm_steps
        shorts: dict[int, tuple[Trial, float]] = {}

        def run_short(batch_size: int) -> tuple[Trial, float]:
            if batch_size not in shorts:
                shorts[batch_size] = timed(short, batch_size)
            return shorts[batch_size]

        def fits(batch_size: int) -> bool:
            return run_short(batch_size)[0].fits

        top, _ = largest_fitting(fits, 8, MAX_BATCH_SIZE)
        reference = top or 1
        dense = range(max(1, math.floor(DENSE_BELOW * reference)), math.ceil(DENSE_ABOVE * reference) + 2)
        sizes = sorted({*grid(MAX_BATCH_SIZE), *(s for s in dense if s <= MAX_BATCH_SIZE)})
        curve = Curve(
            case.workload,
            case.name,
            case.cap,
            bench.cap_bytes,
            budget,
            STEPS_PER_TRIAL,
            confirm_steps if longer is not None else None,
            MAX_BATCH_SIZE,
            top,
        )
        for batch_size in sizes:
            trial, seconds = run_short(batch_size)
            point = Point(batch_size, trial.to_dict(), short_seconds=seconds)
            if longer is not None and trial.fits and batch_size >= DENSE_BELOW * reference:
                long, point.long_seconds = timed(longer, batch_size)
                point.long = long.to_dict()
            curve.points.append(point)
        opening = {size: record for size, record in short.records.items() if size <= OPENING}
        curve.records = {str(size): record.to_dict() for size, record in sorted(opening.items())}
        if longer is not None:
            curve.near_records = {
                str(size): record.to_dict() for size, record in sorted(longer.records.items())
            }
        curve.soft_workspaces = target.soft_workspaces
    finally:
        snapshot.restore(gradients=True)
        target.release()
    curve.seconds = time.perf_counter() - started
    _find_itself(bench, curve)
    return curve


def _runners(
    workload: Workload, target: Device, budget: int, snapshot: TrainingSnapshot
) -> tuple[TrialRunner, TrialRunner | None]:
    """find's runners of the case: its short trials, and behind a caching allocator that asks for
    more steps its confirming trials; each records its opening as find's do there."""
    confirm_steps = target.confirm_steps
    recording = confirm_steps is not None  # as find records its opening behind a caching allocator
    short = TrialRunner.on(
        workload, target, "train", STEPS_PER_TRIAL, budget, snapshot, None, record=recording
    )
    if confirm_steps is None or confirm_steps <= STEPS_PER_TRIAL:
        return short, None
    longer = TrialRunner.on(
        workload,
        target,
        "train",
        confirm_steps,
        budget,
        snapshot,
        None,
        record=recording,
        record_steps=STEPS_PER_TRIAL,  # as find records a confirming trial
    )
    return short, longer


def timed(runner: TrialRunner, batch_size: int) -> tuple[Trial, float]:
    started = time.perf_counter()
    trial = runner.run(batch_size)
    return trial, time.perf_counter() - started


def _find_itself(bench: Bench, curve: Curve) -> None:
    """``find_batch_size`` on the workload put back as built, under the same cap, as
    ``bench/find.py`` runs it."""
    workload, _ = bench.workload()
    result = bench.find(workload)
    checked = len(result.band.confirmed_at) if result.band is not None else 0
    searched = result.trials[: len(result.trials) - checked]
    curve.find_sizes = [t.batch_size for t in searched]
    curve.find_steps = [t.steps for t in searched]
    curve.find_band = [t.batch_size for t in result.trials[len(searched) :]]
    curve.find_answer = result.batch_size
    curve.find_traces = len(result.predicted_trials)


def describe(curve: Curve) -> str:
    fitting = [p.batch_size for p in curve.points if p.short["outcome"] == "ok"]
    longs = [p for p in curve.points if p.long is not None]
    long_failures = [p.batch_size for p in longs if p.long is not None and p.long["outcome"] != "ok"]
    ended = sorted(p.long["steps"] for p in longs if p.long is not None and p.long.get("steady_from"))
    early = f" ({len(ended)} ended early, at steps {ended[0]}-{ended[-1]})" if ended else ""
    return (
        f"  {len(curve.points)} sizes ({min(p.batch_size for p in curve.points)}.."
        f"{max(p.batch_size for p in curve.points)}), largest fitting {max(fitting, default=None)}"
        f"{f', {len(longs)} longer trials{early}' if longs else ''}"
        f"{f', failed over {curve.confirm_steps} steps at {long_failures}' if long_failures else ''}; "
        f"find: {curve.find_answer} from {curve.find_sizes}"
        f"{f' ({curve.find_traces} traces)' if curve.find_traces else ''}; {curve.seconds:.1f} s"
    )


def main(argv: list[str] | None = None) -> int:
    parser = _harness.parser(
        __doc__, quick="fewer cases", json_default="bench/results/find-curves-DEVICE.json"
    )
    parser.add_argument("--workloads", default=None, help="comma-separated workloads (default: all)")
    args = parser.parse_args(argv)
    device, kind = bench_device(args.device)
    cases = select_cases(parser, kind, args.quick, args.workloads)
    session = _harness.Session(device, PACKAGES)
    print(session.machine())
    curves: list[Curve] = []
    for case in cases:
        why = _workloads.missing(case.workload)
        if why is not None:
            print(f"{case.name}: skipped: {why}")
            continue
        print(f"{case.name} at {case.cap}:", flush=True)
        curve = record(case, device, kind)
        print(f"  cap {format_bytes(curve.cap_bytes)}, budget {format_bytes(curve.budget_bytes)}")
        print(describe(curve), flush=True)
        curves.append(curve)
    payload = {"curves": [asdict(curve) for curve in curves]}
    _harness.save(args, session, _harness.RESULTS / f"find-curves-{kind}.json", payload)
    return 0


if __name__ == "__main__":
    sys.exit(main())

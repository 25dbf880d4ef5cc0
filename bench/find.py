"""Benchmark ``batchfit.find_batch_size`` against the true maximum and against Lightning and accelerate.

Each case is a workload under a memory cap: the built-in examples on a capped CPU (``--device cpu``,
the default), or on a GPU (``--device cuda``) ResNet-50 (fp32, cudnn.benchmark, AMP), GPT-2 and
the examples under a capped caching allocator. Every method runs the same capped trial
(``_capped.py``); each answer is checked against the truth and trains ``CONFIRM_STEPS`` steps.

Run: ``.venv/bin/python bench/find.py [--device cuda] [--quick] [--workloads cnn,mlp]``. Lightning
and accelerate come from the ``bench`` extra (``pip install -e '.[bench]'``); without them their
columns are skipped, as are real models whose package is missing.
"""

from __future__ import annotations

import argparse
import itertools
import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import _harness
import _workloads
import torch
from _capped import CPU_CACHING, MAX_BATCH_SIZE, STEPS_PER_TRIAL, Bench, Case, MethodResult, bench_device
from _peers import COMPETITORS, available_competitors, quiet_competitors

from batchfit.units import format_bytes, parse_bytes

#: Steps in a probe of the CUDA truth, and in the check that each answer trains.
TRUTH_STEPS = 10
CONFIRM_STEPS = 20
PACKAGES = ("torch", "batchfit", "lightning", "accelerate", "torchvision", "transformers")

#: CPU limits chosen so each answer lies in about 16..300 and each exhaustive scan stays short.
#: The mlp's memory is nearly all fixed (weights, gradients, Adam state and its temporaries, about
#: 36 MiB) with about 3 KiB per sample, so its limits are close together.
CASES: dict[str, list[Case]] = {
    "cpu": [
        *(Case("mlp", cap) for cap in ("36.5MiB", "36.75MiB", "37MiB")),
        *(Case("cnn", cap) for cap in ("32MiB", "64MiB", "128MiB")),
        *(Case("transformer", cap) for cap in ("64MiB", "128MiB", "256MiB")),
    ],
    # The issue's cards: 10.5 GiB stands in for an 11 GB RTX 2080 Ti; GPT-2's 16 GiB is 0.8 of 20.
    "cuda": [
        Case("resnet50", "10.5GiB"),
        Case("resnet50", "10.5GiB", cudnn_benchmark=True),
        Case("resnet50-amp", "10.5GiB", precision="16-mixed"),
        Case("gpt2", "16GiB"),
        Case("mlp", "ref:256"),
        Case("cnn", "ref:128"),
        Case("transformer", "ref:128"),
    ],
    # CUDA's caching allocator modelled on the CPU: the built-ins under what a trial at a reference
    # size reserved there, as on the GPU.
    CPU_CACHING: [
        Case("mlp", "ref:256"),
        *(Case("cnn", f"ref:{size}") for size in (32, 64, 128)),
        *(Case("transformer", f"ref:{size}") for size in (32, 64, 128)),
        Case("gpt2-tiny", "ref:24"),  # a Hugging Face model's requests (where transformers is installed)
    ],
}
QUICK: dict[str, list[Case]] = {
    "cpu": [Case("mlp", "36.75MiB"), Case("cnn", "64MiB"), Case("transformer", "128MiB")],
    "cuda": [Case("resnet50-amp", "10.5GiB", precision="16-mixed"), Case("cnn", "ref:128")],
    CPU_CACHING: [Case("cnn", "ref:64"), Case("transformer", "ref:64")],
}


@dataclass
class Truth:
    """The true maximum: by an exhaustive scan of [1, upper] (CPU), or by bisection (CUDA)."""

    true_max: int | None
    upper: int
    first_failure: int | None
    fitting_above_first_failure: list[int]  # non-empty only if fitting is not monotone (scan)
    seconds: float
    peaks: dict[int, int]
    probes: int = 0


@dataclass
class Row:
    case: Case
    cap_bytes: int
    truth: Truth
    batchfit: MethodResult
    competitors: dict[str, MethodResult | None]  # None: the tool is not installed
    # The GPU's live bytes before the methods and after each, in the order they ran (CUDA only).
    live_bytes: dict[str, int] = field(default_factory=dict)


def leftovers(live: dict[str, int], floor: int = 1 << 20) -> str:
    """A note naming the methods after which the GPU's live bytes grew by more than ``floor``
    (empty when none did): their leftovers shrank the room of every method after them."""
    grown = [
        f"{after} {'+' if now >= before else '-'}{format_bytes(abs(now - before))}"
        for (_, before), (after, now) in itertools.pairwise(live.items())
        if abs(now - before) > floor
    ]
    if not grown:
        return ""
    return (
        f"NOTE: live GPU memory changed across methods ({', '.join(grown)}; the first matmul's cuBLAS "
        "workspaces stay for the process): what a method left shrinks the room of those after it"
    )


def run_truth_scan(bench: Bench, upper: int) -> Truth:
    workload, state = bench.workload()
    peaks: dict[int, int] = {}
    started = time.perf_counter()
    for batch_size in range(1, upper + 1):
        peak = bench.trial(workload, state, batch_size, STEPS_PER_TRIAL)
        if peak is not None:
            peaks[batch_size] = peak
    seconds = time.perf_counter() - started
    failures = [b for b in range(1, upper + 1) if b not in peaks]
    first_failure = failures[0] if failures else None
    above = [b for b in peaks if first_failure is not None and b > first_failure]
    return Truth(max(peaks, default=None), upper, first_failure, above, seconds, peaks, upper)


def largest_fitting(fits: Callable[[int], bool], start: int, upper: int) -> tuple[int | None, int]:
    """The largest batch in [1, upper] that ``fits``, and the smallest that does not (upper + 1 if
    none), assuming memory grows with the batch: gallop from ``start`` to a fitting and a failing
    size, then bisect between them."""
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


def run_truth_bisect(bench: Bench, start: int) -> Truth:
    """The largest batch whose TRUTH_STEPS steps complete under the cap (``largest_fitting``)."""
    workload, state = bench.workload()
    peaks: dict[int, int] = {}
    outcomes: dict[int, bool] = {}
    started = time.perf_counter()

    def fits(batch_size: int) -> bool:
        if batch_size not in outcomes:
            peak = bench.trial(workload, state, batch_size, TRUTH_STEPS)
            outcomes[batch_size] = peak is not None
            if peak is not None:
                peaks[batch_size] = peak
        return outcomes[batch_size]

    true_max, first_failure = largest_fitting(fits, start, MAX_BATCH_SIZE)
    seconds = time.perf_counter() - started
    return Truth(true_max, MAX_BATCH_SIZE, first_failure, [], seconds, peaks, len(outcomes))


def confirm(bench: Bench, answer: int | None) -> bool | None:
    """Whether ``answer`` trains CONFIRM_STEPS steps under the cap, from the fresh state."""
    if answer is None:
        return None
    workload, state = bench.workload()
    return bench.trial(workload, state, answer, CONFIRM_STEPS) is not None


def run_batchfit(bench: Bench) -> MethodResult:
    workload, _ = bench.workload()
    with _harness.Stopwatch() as watch:
        result = bench.find(workload)
    peaks = {t.batch_size: t.peak_bytes for t in result.trials if t.fits}
    sizes = [t.batch_size for t in result.trials]
    return MethodResult(
        result.batch_size, sizes, watch.seconds, watch.cpu_seconds, peaks, traces=len(result.predicted_trials)
    )


def _print_method(name: str, result: MethodResult) -> None:
    trains = "" if result.trains is None else f"  trains {CONFIRM_STEPS} steps: {result.trains}"
    print(
        f"  {name:<12} answer {result.answer!s:>4}  {result.trials:>3} trials {result.seconds:7.2f} s "
        f"({result.cpu_seconds:.2f} s CPU)  {result.sizes}{trains}"
        f"{'  ' + result.error if result.error else ''}",
        flush=True,
    )


def measure(runner: Callable[[Bench], MethodResult], bench: Bench, repeat: int) -> MethodResult:
    """Run a method ``repeat`` times; the first run's search, the median of the times.

    A competitor that raises is reported in ``error`` rather than ending the benchmark.
    """
    runs: list[MethodResult] = []
    for _ in range(repeat):
        try:
            runs.append(runner(bench))
        except Exception as error:
            return MethodResult(None, [], 0.0, 0.0, error=f"{type(error).__name__}: {error}")
    first = runs[0]
    if any((run.answer, run.sizes) != (first.answer, first.sizes) for run in runs):
        first.error = f"the runs differ: {[(run.answer, run.sizes) for run in runs]}"
    first.all_seconds = [run.seconds for run in runs]
    first.seconds = statistics.median(first.all_seconds)
    first.cpu_seconds = statistics.median(run.cpu_seconds for run in runs)
    return first


def bench_one(bench: Bench, competitors: dict[str, bool], repeat: int, truth_by: str) -> Row:
    live: dict[str, int] = {}

    def note_live(after: str) -> None:
        if (now := bench.live_bytes()) is not None:
            live[after] = now

    note_live("start")
    ours = measure(run_batchfit, bench, repeat)
    note_live("batchfit")
    if ours.answer is None:
        raise RuntimeError(f"batchfit failed on {bench.case.name} at {bench.case.cap}: {ours.error}")
    results: dict[str, MethodResult | None] = {}
    for name, runner in COMPETITORS.items():
        results[name] = measure(runner, bench, repeat) if competitors.get(name) else None
        note_live(name)
    for result in [ours, *results.values()]:
        if result is not None:
            result.trains = confirm(bench, result.answer)
    note_live("20-step checks")
    _print_method("batchfit", ours)
    for name, result in results.items():
        if result is not None:
            _print_method(name, result)
    answers = [r.answer for r in [ours, *results.values()] if r is not None and r.answer is not None]
    if truth_by == "bisect":
        truth = run_truth_bisect(bench, ours.answer)
        how = f"{truth.probes} probes of {TRUTH_STEPS} steps"
    else:
        upper = min(MAX_BATCH_SIZE, max([ours.answer + max(16, ours.answer // 2), *(a + 1 for a in answers)]))
        truth = run_truth_scan(bench, upper)
        how = f"scanned 1..{truth.upper}"
    print(
        f"  truth        true max {truth.true_max} ({how}, first failure {truth.first_failure}) "
        f"in {truth.seconds:.1f} s",
        flush=True,
    )
    if truth.fitting_above_first_failure:
        print(f"  NOTE: fitting is not monotone: {truth.fitting_above_first_failure} fit above a failure")
    note_live("truth")
    if note := leftovers(live):
        print(f"  {note}")
    return Row(bench.case, bench.cap_bytes, truth, ours, results, live)


def headers() -> tuple[str, ...]:
    return (
        "workload",
        "cap",
        "true max",
        "batchfit",
        "exact",
        "bf trains",
        "bf trials",
        "bf traces",
        "bf s",
        "lightning",
        "L trials/bf",
        "L s/bf",
        "accelerate",
        "A trials/bf",
        "A s/bf",
    )


def table_rows(rows: list[Row]) -> list[list[str]]:
    lines = []
    for row in rows:
        ours = row.batchfit
        cells = [
            row.case.name,
            row.case.cap if not row.case.cap.startswith("ref:") else format_bytes(row.cap_bytes),
            str(row.truth.true_max),
            str(ours.answer),
            "yes" if ours.answer == row.truth.true_max else "NO",
            {True: "yes", False: "NO", None: "-"}[ours.trains],
            str(ours.trials),
            str(ours.traces),
            f"{ours.seconds:.2f}",
        ]
        for name in COMPETITORS:
            result = row.competitors.get(name)
            if result is None or result.answer is None:
                cells += ["n/a" if result is None else "error", "-", "-"]
            else:
                cells += [
                    str(result.answer),
                    _harness.ratio(result.trials, ours.trials),
                    _harness.ratio(result.seconds, ours.seconds),
                ]
        lines.append(cells)
    return lines


def _peak_differences(rows: list[Row], method: str) -> str:
    """A method's trial peaks minus the truth's at the same batch sizes: the bytes the tool itself
    allocated inside the cap (0 when it runs exactly the same trial; on CUDA the truth's probes
    run more steps, so only the scan's are compared)."""
    extra = [
        result.peaks[b] - row.truth.peaks[b]
        for row in rows
        if (result := row.batchfit if method == "batchfit" else row.competitors.get(method)) is not None
        for b in result.peaks
        if b in row.truth.peaks
    ]
    return f"{min(extra)}..{max(extra)} bytes" if extra else "no common batch size"


def _spread(ratios: list[float]) -> str:
    return f"{min(ratios):.1f}..{max(ratios):.1f} (geometric mean {statistics.geometric_mean(ratios):.1f})"


#: Lightning's trials and time over batchfit's, at least, in every row: 3 on the CPU (where the
#: fake-tensor forecast places the real trials), 2 on CUDA and its model (every trial is real).
LIGHTNING_TARGET = {"cpu": 3.0, "cuda": 2.0, CPU_CACHING: 2.0}


def print_summary(rows: list[Row], device: str) -> None:
    exact = [row for row in rows if row.batchfit.answer == row.truth.true_max]
    print(f"batchfit exact: {len(exact)}/{len(rows)}")
    for row in rows:
        if row not in exact:
            print(f"  NOT EXACT: {row.case.name} at {row.case.cap}: ", end="")
            print(f"batchfit {row.batchfit.answer}, true maximum {row.truth.true_max}")
    trained = sum(bool(row.batchfit.trains) for row in rows)
    print(f"  its answer trained {CONFIRM_STEPS} steps under the cap: {trained}/{len(rows)}")
    if device == "cpu":
        print(f"  peaks minus the exhaustive scan's: {_peak_differences(rows, 'batchfit')}")
    for name in COMPETITORS:
        ran = [
            (row, r) for row in rows if (r := row.competitors.get(name)) is not None and r.answer is not None
        ]
        if not ran:
            continue
        trials = [r.trials / row.batchfit.trials for row, r in ran]
        seconds = [r.seconds / row.batchfit.seconds for row, r in ran]
        exact_count = sum(r.answer == row.truth.true_max for row, r in ran)
        print(f"{name}: exact {exact_count}/{len(ran)}; as multiples of batchfit's:")
        cpu = [r.cpu_seconds / row.batchfit.cpu_seconds for row, r in ran]
        print(f"  trials {_spread(trials)}, seconds {_spread(seconds)}, CPU seconds {_spread(cpu)}")
        if name == "lightning":
            target = LIGHTNING_TARGET[device]
            met = all(ratio >= target for ratio in trials + seconds)
            print(f"  target, at most 1/{target:g} of Lightning's trials and time in every row:", end=" ")
            print("met" if met else "NOT met")
        trained = sum(bool(r.trains) for _, r in ran)
        print(f"  its answer trained {CONFIRM_STEPS} steps under the cap: {trained}/{len(ran)}")
        if device == "cpu":
            print(f"  peaks minus the exhaustive scan's: {_peak_differences(rows, name)}")


def prepared(case: Case, device: torch.device, kind: str | None = None) -> Bench:
    """The case's bench, warmed up, its cap resolved (``ref:B``: what a trial at ``B`` reserved, on
    the model every method then trains)."""
    bench = Bench(case, device, kind=kind)
    bench.warm_up()
    if case.cap.startswith("ref:"):
        reserved = bench.reserved_at(int(case.cap.partition(":")[2]))
        bench.cap_bytes = int(math.ceil(reserved / 2**20) * 2**20)
    else:
        bench.cap_bytes = parse_bytes(case.cap, name="cap")
    return bench


def select_cases(
    parser: argparse.ArgumentParser, kind: str, quick: bool, workloads: str | None
) -> list[Case]:
    """The cases on this kind of device (``--quick``'s few, or all), kept to ``--workloads``."""
    cases = (QUICK if quick else CASES)[kind]
    if workloads is None:
        return cases
    wanted = workloads.split(",")
    unknown = sorted(set(wanted) - {case.workload for case in CASES[kind]})
    if unknown:
        parser.error(f"unknown workload(s) {', '.join(unknown)} on {kind}")
    return [case for case in cases if case.workload in wanted]


def main(argv: list[str] | None = None) -> int:
    parser = _harness.parser(__doc__, quick="fewer cases", json_default="bench/results/find-DEVICE.json")
    parser.add_argument(
        "--truth",
        choices=("scan", "bisect"),
        default=None,
        help="how the true maximum is found (default: scan on the CPU, bisect on CUDA)",
    )
    parser.add_argument("--workloads", default=None, help="comma-separated workloads (default: all)")
    parser.add_argument(
        "--repeat", type=int, default=1, help="run each search N times and report the median time"
    )
    args = parser.parse_args(argv)
    device, kind = bench_device(args.device)
    cases = select_cases(parser, kind, args.quick, args.workloads)
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")

    session = _harness.Session(device, PACKAGES)
    print(session.machine())
    competitors = available_competitors(device, kind)
    quiet_competitors()  # after their imports, which set their loggers' levels
    rows: list[Row] = []
    for case in cases:
        why = _workloads.missing(case.workload)
        if why is not None:
            print(f"{case.name}: skipped: {why}")
            continue
        bench = prepared(case, device, kind)
        print(f"{case.name} at {case.cap} ({format_bytes(bench.cap_bytes)}):", flush=True)
        rows.append(
            bench_one(bench, competitors, args.repeat, args.truth or ("scan" if kind == "cpu" else "bisect"))
        )

    print()
    _harness.print_text_table(headers(), table_rows(rows))
    print()
    print_summary(rows, kind)
    print(session.finish())
    print()
    _harness.print_markdown_table(headers(), table_rows(rows), text_columns=(0, 1))
    if not args.no_json:
        payload = {
            "steps_per_trial": STEPS_PER_TRIAL,
            "max_batch_size": MAX_BATCH_SIZE,
            "repeat": args.repeat,
            "rows": [asdict(row) for row in rows],
        }
        _harness.write_results(args.json or _harness.RESULTS / f"find-{kind}.json", session, payload)
    return 0 if all(row.batchfit.answer == row.truth.true_max for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

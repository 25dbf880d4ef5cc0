"""Benchmark ``batchfit.find_batch_size`` against the truth and against Lightning and accelerate.

For each built-in example at three memory limits, on a CPU capped with
``batchfit.memory_limit``:

* the true maximum: an exhaustive scan that runs a trial at every batch size from 1 to an upper
  bound above every method's answer (1.5 x batchfit's answer, at least 16 more, and above each
  competitor's); the largest batch that ran without running out of memory;
* batchfit: ``find_batch_size(..., device="cpu", memory_limit=L, fraction=1.0)``;
* PyTorch Lightning: ``Tuner.scale_batch_size(mode="binsearch", steps_per_trial=2, init_val=2,
  max_trials=25, margin=0.0)``;
* accelerate: ``find_executable_batch_size(starting_batch_size=512)``.

A trial is the same for everyone: two training steps (zero_grad, forward, loss, backward,
optimizer.step) from the freshly built state (initial weights, no gradients, empty optimizer
state), on a host batch made outside the cap and copied into it at each step (as batchfit copies a
batch to the device), under ``memory_limit(L, resident=[model, optimizer])``. Competitors are
run with no memory fraction, so batchfit runs with ``fraction=1.0``.

"bf trials" counts batchfit's real trials; "bf traces" its fake-tensor traces, which run the same
step on fake tensors to predict the peak (no memory is allocated) and place the real trials. Their
time is part of "bf s". The trial ratios compare real trials with real trials.

Run: ``.venv/bin/python bench/find.py`` (``--quick``: one limit per example). Lightning and
accelerate come from the ``bench`` extra (``pip install -e '.[bench]'``); without them their
columns are skipped.
"""

from __future__ import annotations

import argparse
import copy
import gc
import importlib.metadata
import inspect
import json
import logging
import os
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import _common as tables  # bench/ is the script's directory, so on sys.path
import torch
from _common import Stopwatch

import batchfit
from batchfit.examples import build_example
from batchfit.workload import Workload, to_device

STEPS_PER_TRIAL = 2
#: The upper bound of every search: batchfit's default max_batch for training, and the batch
#: size accelerate starts from.
MAX_BATCH = 512
CPU = torch.device("cpu")
LIGHTNING_INIT_VAL = 2

#: Limits chosen so each answer lies in about 16..300 and each exhaustive scan stays short.
#: The mlp's memory is nearly all fixed (weights, gradients, Adam state and its temporaries, about
#: 36 MiB) with about 3 KiB per sample, so its limits are close together.
LIMITS: dict[str, tuple[str, ...]] = {
    "mlp": ("36.5MiB", "36.75MiB", "37MiB"),
    "cnn": ("32MiB", "64MiB", "128MiB"),
    "transformer": ("64MiB", "128MiB", "256MiB"),
}
QUICK_LIMITS: dict[str, tuple[str, ...]] = {
    "mlp": ("36.75MiB",),
    "cnn": ("64MiB",),
    "transformer": ("128MiB",),
}
RESULTS_PATH = Path(__file__).resolve().parent / "results" / "find.json"


@dataclass
class MethodResult:
    """One method's search: its answer, the batch sizes it ran in order, and its wall time."""

    answer: int | None
    sizes: list[int]
    seconds: float  # wall-clock (perf_counter); with --repeat, the median of the runs
    cpu_seconds: float  # this process's CPU time (all threads), less disturbed by other processes
    peaks: dict[int, int] = field(default_factory=dict)  # batch size -> peak bytes of a fitting trial
    error: str = ""
    all_seconds: list[float] = field(default_factory=list)  # every run's wall-clock seconds
    traces: int = 0  # batchfit only: fake-tensor traces (predictions, no memory allocated)

    @property
    def trials(self) -> int:
        return len(self.sizes)


@dataclass
class Truth:
    """The exhaustive scan: every batch size in [1, upper] run once."""

    true_max: int | None
    upper: int
    first_failure: int | None
    fitting_above_first_failure: list[int]  # non-empty only if fitting is not monotone
    seconds: float
    peaks: dict[int, int]


@dataclass
class Row:
    example: str
    limit: str
    truth: Truth
    batchfit: MethodResult
    competitors: dict[str, MethodResult | None]  # None: the tool is not installed


class FreshState:
    """Puts a workload's model and optimizer back as built: initial weights, no gradients, no
    optimizer state (so it is created on the first step of each trial, for every method alike)."""

    def __init__(self, workload: Workload) -> None:
        if not isinstance(workload.optimizer, torch.optim.Optimizer):
            raise TypeError("the built-in examples hold an Optimizer instance")
        self.model = workload.model
        self.optimizer: torch.optim.Optimizer = workload.optimizer
        self.weights = copy.deepcopy(self.model.state_dict())

    def reset(self) -> None:
        self.model.load_state_dict(self.weights)
        for parameter in self.model.parameters():
            parameter.grad = None
        self.optimizer.state.clear()
        self.model.train()


def train_steps(workload: Workload, optimizer: torch.optim.Optimizer, host_batch: Any) -> None:
    """The trial every method runs: STEPS_PER_TRIAL steps, each on a fresh copy of the batch."""
    assert workload.loss_fn is not None
    for _ in range(STEPS_PER_TRIAL):
        inputs, target = to_device(host_batch, CPU)
        optimizer.zero_grad(set_to_none=True)
        workload.loss_fn(workload.model(inputs), target).backward()  # the loss is freed before step
        optimizer.step()
        del inputs, target


def capped_trial(workload: Workload, state: FreshState, limit: str, batch_size: int) -> int | None:
    """Run one trial under the cap from the fresh state; its peak bytes, or None if it ran out."""
    state.reset()
    host_batch = workload.host_batch(batch_size)  # outside the cap, like batchfit's data
    try:
        with batchfit.memory_limit(limit, resident=[state.model, state.optimizer]) as tracker:
            train_steps(workload, state.optimizer, host_batch)
    except Exception as error:
        if not batchfit.is_out_of_memory(error):
            raise
        del error
        gc.collect()
        return None
    return tracker.peak_bytes


# -- the methods ---------------------------------------------------------------------------------


def run_truth(example: str, limit: str, upper: int) -> Truth:
    workload = build_example(example)
    state = FreshState(workload)
    peaks: dict[int, int] = {}
    started = time.perf_counter()
    for batch_size in range(1, upper + 1):
        peak = capped_trial(workload, state, limit, batch_size)
        if peak is not None:
            peaks[batch_size] = peak
    seconds = time.perf_counter() - started
    failures = [b for b in range(1, upper + 1) if b not in peaks]
    first_failure = failures[0] if failures else None
    above = [b for b in peaks if first_failure is not None and b > first_failure]
    return Truth(max(peaks, default=None), upper, first_failure, above, seconds, peaks)


def run_batchfit(example: str, limit: str) -> MethodResult:
    workload = build_example(example)
    with Stopwatch() as watch:
        result = batchfit.find_batch_size(
            workload,
            "train",
            device="cpu",
            memory_limit=limit,
            fraction=1.0,
            max_batch=MAX_BATCH,
            steps_per_trial=STEPS_PER_TRIAL,
        )
    peaks = {t.batch_size: t.peak_bytes for t in result.trials if t.fits}
    sizes = [t.batch_size for t in result.trials]
    return MethodResult(
        result.batch_size, sizes, watch.seconds, watch.cpu_seconds, peaks, traces=len(result.predicted_trials)
    )


def run_lightning(example: str, limit: str) -> MethodResult:
    """Lightning's binsearch, each of its trials (one ``_try_loop_run``) under the cap.

    The cap is entered around each trial rather than around the whole tuner call, so that the
    checkpoint Lightning saves before the search and loads after it is not counted; and each
    trial starts from the fresh state, as Lightning alone would carry gradients and optimizer
    state over from one trial to the next. The module uses manual optimization so that its step
    is the same as everyone's (Lightning's automatic optimization zeroes the gradients after the
    forward pass, which keeps the previous step's gradients alive through it).
    """
    import lightning.pytorch as pl
    from lightning.pytorch.tuner import batch_size_scaling
    from lightning.pytorch.tuner.tuning import Tuner

    workload = build_example(example)
    state = FreshState(workload)
    optimizer = state.optimizer

    class HostBatches(torch.utils.data.IterableDataset[Any]):
        """STEPS_PER_TRIAL copies of the trial's host batch (made outside the cap)."""

        def __init__(self, module: LitWorkload) -> None:
            self.module = module

        def __iter__(self) -> Iterator[Any]:
            for _ in range(STEPS_PER_TRIAL):
                yield self.module.host_batch

    class LitWorkload(pl.LightningModule):
        host_batch: Any  # the trial's batch, made outside the cap
        _batch_size: int

        # Lightning sets ``batch_size`` before it rebuilds the data loader, and its data fetcher
        # may take the first batch before the trial starts: the host batch is made right here,
        # outside the cap, so each trial's steps all run at the trial's batch size.
        @property
        def batch_size(self) -> int:
            return self._batch_size

        @batch_size.setter
        def batch_size(self, value: int) -> None:
            self._batch_size = int(value)
            self.host_batch = workload.host_batch(self._batch_size)

        def __init__(self) -> None:
            super().__init__()
            self.model = workload.model
            self.batch_size = LIGHTNING_INIT_VAL  # the first trial's batch, from its first step
            self.automatic_optimization = False

        def train_dataloader(self) -> torch.utils.data.DataLoader[Any]:
            return torch.utils.data.DataLoader(HostBatches(self), batch_size=None)

        def training_step(self, batch: Any, batch_idx: int) -> None:
            lit_optimizer = self.optimizers()
            assert not isinstance(lit_optimizer, list)
            inputs, target = to_device(batch, CPU)
            lit_optimizer.zero_grad(set_to_none=True)
            assert workload.loss_fn is not None
            self.manual_backward(workload.loss_fn(self.model(inputs), target))
            lit_optimizer.step()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return optimizer

    module = LitWorkload()
    sizes: list[int] = []
    peaks: dict[int, int] = {}
    original = batch_size_scaling._try_loop_run

    def capped_try_loop_run(trainer: pl.Trainer, params: dict[str, Any]) -> None:
        batch_size = module.batch_size
        sizes.append(batch_size)
        state.reset()
        with batchfit.memory_limit(limit, resident=[state.model, optimizer]) as tracker:
            original(trainer, params)
        peaks[batch_size] = tracker.peak_bytes

    with tempfile.TemporaryDirectory() as root:
        trainer = pl.Trainer(
            accelerator="cpu",
            devices=1,
            max_epochs=1,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            default_root_dir=root,
        )
        tuner = Tuner(trainer)
        options: dict[str, Any] = {
            "mode": "binsearch",
            "steps_per_trial": STEPS_PER_TRIAL,
            "init_val": LIGHTNING_INIT_VAL,
            "max_trials": 25,
        }
        if "margin" in inspect.signature(tuner.scale_batch_size).parameters:
            options["margin"] = 0.0  # Lightning >= 2.5 takes 5% off the boundary by default
        batch_size_scaling._try_loop_run = capped_try_loop_run
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # Lightning's advice on workers, logging intervals...
                with Stopwatch() as watch:
                    answer = tuner.scale_batch_size(module, **options)
        finally:
            batch_size_scaling._try_loop_run = original
    return MethodResult(answer, sizes, watch.seconds, watch.cpu_seconds, peaks)


def run_accelerate(example: str, limit: str) -> MethodResult:
    """accelerate's decorator from MAX_BATCH down; each call of the inner function is a trial."""
    from accelerate.utils import find_executable_batch_size

    workload = build_example(example)
    state = FreshState(workload)
    sizes: list[int] = []
    peaks: dict[int, int] = {}

    @find_executable_batch_size(starting_batch_size=MAX_BATCH)  # type: ignore[untyped-decorator]
    def train(batch_size: int) -> int:
        sizes.append(batch_size)
        state.reset()
        host_batch = workload.host_batch(batch_size)
        with batchfit.memory_limit(limit, resident=[state.model, state.optimizer]) as tracker:
            train_steps(workload, state.optimizer, host_batch)
        peaks[batch_size] = tracker.peak_bytes
        return batch_size

    with Stopwatch() as watch:
        answer = train()
    return MethodResult(int(answer), sizes, watch.seconds, watch.cpu_seconds, peaks)


COMPETITORS: dict[str, Callable[[str, str], MethodResult]] = {
    "lightning": run_lightning,
    "accelerate": run_accelerate,
}


def versions() -> dict[str, str | None]:
    found: dict[str, str | None] = {}
    for package in ("torch", "batchfit", "lightning", "accelerate"):
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            found[package] = None
    return found


# -- setup checks --------------------------------------------------------------------------------


def _cap_error() -> RuntimeError:
    """The error batchfit's cap raises, to check that each competitor recognises it as an OOM."""
    try:
        with batchfit.memory_limit("1KiB"):
            torch.ones(1024)
    except RuntimeError as error:
        return error
    raise AssertionError("a 4 KiB tensor fitted a 1 KiB cap")


def available_competitors() -> dict[str, bool]:
    """Which competitors can run: importable, and recognising the cap's error as out of memory."""
    error = _cap_error()
    found: dict[str, bool] = {}
    try:
        import lightning
        from lightning.pytorch.tuner import batch_size_scaling
        from lightning.pytorch.utilities.memory import is_oom_error

        if not is_oom_error(error):
            print(
                f"lightning {lightning.__version__}: is_oom_error does not recognise the cap's error; skipped"
            )
        elif not hasattr(batch_size_scaling, "_try_loop_run"):
            print(f"lightning {lightning.__version__}: no _try_loop_run to cap each trial at; skipped")
        else:
            found["lightning"] = True
            print(f"lightning {lightning.__version__}: is_oom_error recognises the cap's error")
    except ImportError as missing:
        print(f"lightning is not installed ({missing}); its columns are skipped. pip install -e '.[bench]'")
    try:
        import accelerate
        from accelerate.utils.memory import should_reduce_batch_size

        if should_reduce_batch_size(error):
            found["accelerate"] = True
            print(f"accelerate {accelerate.__version__}: should_reduce_batch_size recognises the cap's error")
        else:
            print(f"accelerate {accelerate.__version__}: the cap's error is not recognised; skipped")
    except ImportError as missing:
        print(f"accelerate is not installed ({missing}); its columns are skipped. pip install -e '.[bench]'")
    return found


def quiet_competitors() -> None:
    for name in ("lightning", "lightning.pytorch", "lightning.fabric", "pytorch_lightning", "accelerate"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", module=r"lightning(\..*)?")
    warnings.filterwarnings("ignore", message=r".*(num_workers|does not have many workers).*")


def warm_up(example: str) -> None:
    """One uncapped, untimed trial so no method pays for first-call kernel setup."""
    workload = build_example(example)
    train_steps(workload, FreshState(workload).optimizer, workload.host_batch(4))


# -- the benchmark -------------------------------------------------------------------------------


def _print_method(name: str, result: MethodResult) -> None:
    print(
        f"  {name:<12} answer {result.answer!s:>4}  {result.trials:>3} trials {result.seconds:7.2f} s "
        f"({result.cpu_seconds:.2f} s CPU)  {result.sizes}{'  ' + result.error if result.error else ''}",
        flush=True,
    )


def measure(
    runner: Callable[[str, str], MethodResult], example: str, limit: str, repeat: int
) -> MethodResult:
    """Run a method ``repeat`` times; the first run's search, the median of the times.

    A competitor that raises is reported in ``error`` rather than ending the benchmark.
    """
    runs: list[MethodResult] = []
    for _ in range(repeat):
        try:
            runs.append(runner(example, limit))
        except Exception as error:
            return MethodResult(None, [], 0.0, 0.0, error=f"{type(error).__name__}: {error}")
    first = runs[0]
    if any((run.answer, run.sizes) != (first.answer, first.sizes) for run in runs):
        first.error = f"the runs differ: {[(run.answer, run.sizes) for run in runs]}"
    first.all_seconds = [run.seconds for run in runs]
    first.seconds = statistics.median(first.all_seconds)
    first.cpu_seconds = statistics.median(run.cpu_seconds for run in runs)
    return first


def bench_one(example: str, limit: str, competitors: dict[str, bool], repeat: int) -> Row:
    ours = measure(run_batchfit, example, limit, repeat)
    _print_method("batchfit", ours)
    if ours.answer is None:
        raise RuntimeError(f"batchfit failed on {example} at {limit}: {ours.error}")
    results: dict[str, MethodResult | None] = {}
    for name, runner in COMPETITORS.items():
        if competitors.get(name):
            result = measure(runner, example, limit, repeat)
            _print_method(name, result)
            results[name] = result
        else:
            results[name] = None
    answers = [r.answer for r in [ours, *results.values()] if r is not None and r.answer is not None]
    upper = min(MAX_BATCH, max([ours.answer + max(16, ours.answer // 2), *(a + 1 for a in answers)]))
    truth = run_truth(example, limit, upper)
    print(
        f"  exhaustive   true max {truth.true_max} (scanned 1..{truth.upper}, first failure "
        f"{truth.first_failure}) in {truth.seconds:.1f} s",
        flush=True,
    )
    if truth.fitting_above_first_failure:
        print(f"  NOTE: fitting is not monotone: {truth.fitting_above_first_failure} fit above a failure")
    return Row(example, limit, truth, ours, results)


def _ratio(value: float, base: float) -> str:
    return f"{value / base:.1f}x" if base > 0 else "-"


HEADERS = (
    "example",
    "limit",
    "true max",
    "batchfit",
    "exact",
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
            row.example,
            row.limit,
            str(row.truth.true_max),
            str(ours.answer),
            "yes" if ours.answer == row.truth.true_max else "NO",
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
                    _ratio(result.trials, ours.trials),
                    _ratio(result.seconds, ours.seconds),
                ]
        lines.append(cells)
    return lines


def print_text_table(rows: list[Row]) -> None:
    tables.print_text_table(HEADERS, table_rows(rows))


def print_markdown_table(rows: list[Row]) -> None:
    tables.print_markdown_table(HEADERS, table_rows(rows), text_columns=(0, 1))


def _peak_differences(rows: list[Row], method: str) -> str:
    """A method's trial peaks minus the exhaustive scan's at the same batch sizes: the bytes the
    tool itself allocated inside the cap (0 when it runs exactly the same trial)."""
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


def print_summary(rows: list[Row]) -> None:
    exact = [row for row in rows if row.batchfit.answer == row.truth.true_max]
    print(f"batchfit exact: {len(exact)}/{len(rows)}")
    for row in rows:
        if row not in exact:
            print(f"  NOT EXACT: {row.example} at {row.limit}: ", end="")
            print(f"batchfit {row.batchfit.answer}, true maximum {row.truth.true_max}")
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
            met = all(ratio >= 3 for ratio in trials + seconds)
            print("  target, at most a third of Lightning's trials and time in every row:", end=" ")
            print("met" if met else "NOT met")
        print(f"  peaks minus the exhaustive scan's: {_peak_differences(rows, name)}")


def _load_average() -> str:
    try:
        return " ".join(f"{value:.2f}" for value in os.getloadavg())
    except OSError:
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="one limit per example")
    parser.add_argument("--examples", default="mlp,cnn,transformer", help="comma-separated examples")
    parser.add_argument(
        "--json", type=Path, default=RESULTS_PATH, help=f"results file (default {RESULTS_PATH})"
    )
    parser.add_argument("--no-json", action="store_true", help="do not write the results file")
    parser.add_argument(
        "--repeat", type=int, default=1, help="run each search N times and report the median time"
    )
    args = parser.parse_args(argv)
    examples = args.examples.split(",")
    unknown = sorted(set(examples) - set(LIMITS))
    if unknown:
        parser.error(f"unknown example(s) {', '.join(unknown)}: choose from {', '.join(LIMITS)}")
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")

    began = time.perf_counter()
    found = ", ".join(f"{name} {version or 'not installed'}" for name, version in versions().items())
    print(f"{found}; {torch.get_num_threads()} torch threads; load average {_load_average()}")
    competitors = available_competitors()
    quiet_competitors()  # after their imports, which set their loggers' levels
    limits = QUICK_LIMITS if args.quick else LIMITS
    rows: list[Row] = []
    for example in examples:
        warm_up(example)
        for limit in limits[example]:
            print(f"{example} at {limit}:", flush=True)
            rows.append(bench_one(example, limit, competitors, args.repeat))

    print()
    print_text_table(rows)
    print()
    print_summary(rows)
    total = time.perf_counter() - began
    print(f"total wall time {total:.0f} s; load average {_load_average()} (1, 5, 15 min)")
    print()
    print_markdown_table(rows)
    if not args.no_json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        payload = {
            "steps_per_trial": STEPS_PER_TRIAL,
            "max_batch": MAX_BATCH,
            "repeat": args.repeat,
            "versions": versions(),
            "total_seconds": total,
            "load_average_at_end": _load_average(),
            "rows": [asdict(row) for row in rows],
        }
        args.json.write_text(json.dumps(payload, indent=1))
        print(f"\nwrote {args.json}")
    return 0 if all(row.batchfit.answer == row.truth.true_max for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

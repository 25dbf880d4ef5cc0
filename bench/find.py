"""Benchmark ``batchfit.find_batch_size`` against the truth and against Lightning and accelerate.

Each case is a workload under a memory cap, on the CPU (``--device cpu``, the default: the
built-in examples on a CPU capped with ``batchfit.memory_limit``) or on a GPU (``--device cuda``:
torchvision's ResNet-50 in fp32, with cuDNN's benchmark mode and with AMP, a Hugging Face GPT-2
built from its config, and the built-in examples; a smaller card is emulated by capping the
caching allocator with ``batchfit.memory_limit(..., device="cuda")``). For each case:

* the true maximum. On the CPU: an exhaustive scan that runs a trial at every batch size from 1
  to an upper bound above every method's answer (1.5 x batchfit's answer, at least 16 more, and
  above each competitor's); the largest batch that ran without running out of memory. On CUDA:
  the user's question answered by force: the largest batch whose ``TRUTH_STEPS`` training
  steps complete under the cap, found by galloping from batchfit's answer and bisecting, each
  probe from the fresh state with the allocator's cache emptied (``--truth bisect`` does the same
  on the CPU);
* batchfit: ``find_batch_size(..., device=D, memory_limit=L, fraction=1.0)``;
* PyTorch Lightning: ``Tuner.scale_batch_size(mode="binsearch", steps_per_trial=2, init_val=2,
  max_trials=25, margin=0.0)`` (``precision="16-mixed"`` for the AMP case);
* accelerate: ``find_executable_batch_size(starting_batch_size=512)``.

A trial is the same for everyone: two training steps from the freshly built state (initial
weights, no gradients, empty optimizer state, nothing cached), on a host batch made outside the
cap and copied into it at each step, under ``memory_limit(L, resident=[model, optimizer],
device=D)``. Competitors are run with no memory fraction, so batchfit runs with ``fraction=1.0``.
Each method's answer then trains ``CONFIRM_STEPS`` steps under the cap ("trains").

"bf trials" counts batchfit's real trials; "bf traces" its fake-tensor traces (CPU only), which
run the same step on fake tensors to predict the peak (no memory is allocated) and place the real
trials. Their time is part of "bf s". The trial ratios compare real trials with real trials.

Run: ``.venv/bin/python bench/find.py [--device cuda]`` (``--quick``: one case per workload).
Lightning and accelerate come from the ``bench`` extra (``pip install -e '.[bench]'``); without
them their columns are skipped, as are real models whose package is missing.
"""

from __future__ import annotations

import argparse
import copy
import gc
import importlib.metadata
import inspect
import json
import logging
import math
import os
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import _common as tables  # bench/ is the script's directory, so on sys.path
import _workloads
import torch
from _common import Stopwatch

import batchfit
from batchfit.device import Measurement, parse_device
from batchfit.units import format_bytes, parse_bytes
from batchfit.workload import Workload, to_device

STEPS_PER_TRIAL = 2
#: Steps in a probe of the CUDA truth, and in the check that each answer trains.
TRUTH_STEPS = 10
CONFIRM_STEPS = 20
#: The upper bound of every search: batchfit's default max_batch for training, and the batch
#: size accelerate starts from.
MAX_BATCH = 512
LIGHTNING_INIT_VAL = 2


@dataclass(frozen=True)
class Case:
    """A workload under a cap. ``cap`` is a size, or ``ref:B``: the memory a trial at batch ``B``
    reserved (CUDA), so that the built-in examples get answers near ``B`` on any GPU."""

    workload: str
    cap: str
    precision: str = "32-true"  # Lightning's precision: "16-mixed" where the step uses AMP
    cudnn_benchmark: bool = False

    @property
    def name(self) -> str:
        return self.workload + (" (cudnn.benchmark)" if self.cudnn_benchmark else "")


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
}
QUICK: dict[str, list[Case]] = {
    "cpu": [Case("mlp", "36.75MiB"), Case("cnn", "64MiB"), Case("transformer", "128MiB")],
    "cuda": [Case("resnet50-amp", "10.5GiB", precision="16-mixed"), Case("cnn", "ref:128")],
}
RESULTS = Path(__file__).resolve().parent / "results"


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
    trains: bool | None = None  # CUDA: the answer trains CONFIRM_STEPS steps under the cap

    @property
    def trials(self) -> int:
        return len(self.sizes)


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


class Bench:
    """One case on one device: a fresh workload per method, and the capped trial they all run."""

    def __init__(self, case: Case, device: torch.device, cap_bytes: int = 0) -> None:
        self.case, self.device, self.cap_bytes = case, device, cap_bytes

    def workload(self) -> tuple[Workload, FreshState]:
        torch.backends.cudnn.benchmark = self.case.cudnn_benchmark
        workload = _workloads.build(self.case.workload, self.device)
        return workload, FreshState(workload)

    def train_steps(
        self, workload: Workload, optimizer: torch.optim.Optimizer, host: Any, steps: int
    ) -> None:
        """The trial every method runs: ``steps`` steps, each on a fresh copy of the batch."""
        for _ in range(steps):
            workload.run_train_step(optimizer, to_device(host, self.device))
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def capped(self, state: FreshState) -> AbstractContextManager[Measurement]:
        return batchfit.memory_limit(
            self.cap_bytes, resident=[state.model, state.optimizer], device=self.device
        )

    def trial(self, workload: Workload, state: FreshState, batch_size: int, steps: int) -> int | None:
        """Run one trial under the cap from the fresh state; its peak bytes, or None if it ran out."""
        state.reset()
        host = workload.host_batch(batch_size)  # outside the cap, like batchfit's data
        try:
            with self.capped(state) as measurement:
                self.train_steps(workload, state.optimizer, host, steps)
        except Exception as error:
            if not batchfit.is_out_of_memory(error):
                raise
            del error
            state.reset()
            return None
        return measurement.peak_bytes

    def reserved_at(self, batch_size: int) -> int:
        """What a trial at ``batch_size`` reserved, uncapped: a cap near what it needs."""
        workload, state = self.workload()
        state.reset()
        host = workload.host_batch(batch_size)
        with batchfit.memory_limit(2**50, resident=[workload.model], device=self.device) as measurement:
            self.train_steps(workload, state.optimizer, host, STEPS_PER_TRIAL)
        return int(measurement.reserved_peak_bytes or measurement.peak_bytes)


class FreshState:
    """Puts a workload's model and optimizer back as built: initial weights, no gradients, no
    optimizer state (so it is created on the first step of each trial, for every method alike),
    and nothing left in the allocator's cache."""

    def __init__(self, workload: Workload) -> None:
        if not isinstance(workload.optimizer, torch.optim.Optimizer):
            raise TypeError("the benchmark's workloads hold an Optimizer instance")
        self.model = workload.model
        self.optimizer: torch.optim.Optimizer = workload.optimizer
        self.weights = copy.deepcopy(self.model.state_dict())
        self.cuda = any(parameter.is_cuda for parameter in self.model.parameters())

    def reset(self) -> None:
        self.model.load_state_dict(self.weights)
        for parameter in self.model.parameters():
            parameter.grad = None
        self.optimizer.state.clear()
        self.model.train()
        if self.cuda:  # what batchfit's CUDA trials do first too (on the CPU nothing is cached)
            gc.collect()
            torch.cuda.empty_cache()


# -- the methods ---------------------------------------------------------------------------------


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

    true_max, first_failure = largest_fitting(fits, start, MAX_BATCH)
    seconds = time.perf_counter() - started
    return Truth(true_max, MAX_BATCH, first_failure, [], seconds, peaks, len(outcomes))


def confirm(bench: Bench, answer: int | None) -> bool | None:
    """Whether ``answer`` trains CONFIRM_STEPS steps under the cap, from the fresh state."""
    if answer is None:
        return None
    workload, state = bench.workload()
    return bench.trial(workload, state, answer, CONFIRM_STEPS) is not None


def run_batchfit(bench: Bench) -> MethodResult:
    workload, state = bench.workload()
    state.reset()
    with Stopwatch() as watch:
        result = batchfit.find_batch_size(
            workload,
            "train",
            device=bench.device,
            memory_limit=bench.cap_bytes,
            fraction=1.0,
            max_batch=MAX_BATCH,
            steps_per_trial=STEPS_PER_TRIAL,
        )
    peaks = {t.batch_size: t.peak_bytes for t in result.trials if t.fits}
    sizes = [t.batch_size for t in result.trials]
    return MethodResult(
        result.batch_size, sizes, watch.seconds, watch.cpu_seconds, peaks, traces=len(result.predicted_trials)
    )


def run_lightning(bench: Bench) -> MethodResult:
    """Lightning's binsearch, each of its trials (one ``_try_loop_run``) under the cap.

    The cap is entered around each trial rather than around the whole tuner call, so that the
    checkpoint Lightning saves before the search and loads after it is not counted; and each
    trial starts from the fresh state, as Lightning alone would carry gradients and optimizer
    state over from one trial to the next. The module uses manual optimization so that its step
    is the same as everyone's (Lightning's automatic optimization zeroes the gradients after the
    forward pass, which keeps the previous step's gradients alive through it). On a GPU, Lightning
    moves each batch to the device itself, inside the trial.
    """
    import lightning.pytorch as pl
    from lightning.pytorch.tuner import batch_size_scaling
    from lightning.pytorch.tuner.tuning import Tuner

    workload, state = bench.workload()
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
            if bench.device.type == "cpu":  # the copy a GPU run makes when Lightning moves the batch
                batch = to_device(batch, bench.device)
            lit_optimizer.zero_grad(set_to_none=True)
            self.manual_backward(_workloads.loss_of(workload, batch))
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
        with bench.capped(state) as measurement:
            original(trainer, params)
        peaks[batch_size] = measurement.peak_bytes

    with tempfile.TemporaryDirectory() as root:
        trainer = pl.Trainer(
            accelerator="gpu" if bench.device.type == "cuda" else "cpu",
            devices=[bench.device.index or 0] if bench.device.type == "cuda" else 1,
            precision=bench.case.precision,  # type: ignore[arg-type]
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


def run_accelerate(bench: Bench) -> MethodResult:
    """accelerate's decorator from MAX_BATCH down; each call of the inner function is a trial."""
    from accelerate.utils import find_executable_batch_size

    workload, state = bench.workload()
    sizes: list[int] = []
    peaks: dict[int, int] = {}

    @find_executable_batch_size(starting_batch_size=MAX_BATCH)  # type: ignore[untyped-decorator]
    def train(batch_size: int) -> int:
        sizes.append(batch_size)
        state.reset()
        host = workload.host_batch(batch_size)
        with bench.capped(state) as measurement:
            bench.train_steps(workload, state.optimizer, host, STEPS_PER_TRIAL)
        peaks[batch_size] = measurement.peak_bytes
        return batch_size

    with Stopwatch() as watch:
        answer = train()
    return MethodResult(int(answer), sizes, watch.seconds, watch.cpu_seconds, peaks)


COMPETITORS: dict[str, Callable[[Bench], MethodResult]] = {
    "lightning": run_lightning,
    "accelerate": run_accelerate,
}


def versions() -> dict[str, str | None]:
    found: dict[str, str | None] = {}
    for package in ("torch", "batchfit", "lightning", "accelerate", "torchvision", "transformers"):
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            found[package] = None
    return found


# -- setup checks --------------------------------------------------------------------------------


def _cap_error(device: torch.device) -> RuntimeError:
    """The error the cap raises, to check that each competitor recognises it as an OOM."""
    try:
        with batchfit.memory_limit("1KiB", device=device):
            torch.ones(2**20, device=device)
    except RuntimeError as error:
        return error
    raise AssertionError("a 4 MiB tensor fitted a 1 KiB cap")


def available_competitors(device: torch.device) -> dict[str, bool]:
    """Which competitors can run: importable, and recognising the cap's error as out of memory."""
    error = _cap_error(device)
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


def warm_up(bench: Bench) -> None:
    """One uncapped, untimed trial so no method pays for first-call setup (on CUDA: the context,
    library handles and cuBLAS's workspace, which stays allocated for every method alike)."""
    workload, state = bench.workload()
    state.reset()
    bench.train_steps(workload, state.optimizer, workload.host_batch(4), STEPS_PER_TRIAL)
    state.reset()


# -- the benchmark -------------------------------------------------------------------------------


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
    ours = measure(run_batchfit, bench, repeat)
    if ours.answer is None:
        raise RuntimeError(f"batchfit failed on {bench.case.name} at {bench.case.cap}: {ours.error}")
    results: dict[str, MethodResult | None] = {}
    for name, runner in COMPETITORS.items():
        results[name] = measure(runner, bench, repeat) if competitors.get(name) else None
    for result in [ours, *results.values()]:
        if result is not None:
            result.trains = confirm(bench, result.answer)
    _print_method("batchfit", ours)
    for name, result in results.items():
        if result is not None:
            _print_method(name, result)
    answers = [r.answer for r in [ours, *results.values()] if r is not None and r.answer is not None]
    if truth_by == "bisect":
        truth = run_truth_bisect(bench, ours.answer)
        how = f"{truth.probes} probes of {TRUTH_STEPS} steps"
    else:
        upper = min(MAX_BATCH, max([ours.answer + max(16, ours.answer // 2), *(a + 1 for a in answers)]))
        truth = run_truth_scan(bench, upper)
        how = f"scanned 1..{truth.upper}"
    print(
        f"  truth        true max {truth.true_max} ({how}, first failure {truth.first_failure}) "
        f"in {truth.seconds:.1f} s",
        flush=True,
    )
    if truth.fitting_above_first_failure:
        print(f"  NOTE: fitting is not monotone: {truth.fitting_above_first_failure} fit above a failure")
    return Row(bench.case, bench.cap_bytes, truth, ours, results)


def _ratio(value: float, base: float) -> str:
    return f"{value / base:.1f}x" if base > 0 else "-"


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
                    _ratio(result.trials, ours.trials),
                    _ratio(result.seconds, ours.seconds),
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
#: fake-tensor forecast places the real trials), 2 on CUDA (where every trial is real).
LIGHTNING_TARGET = {"cpu": 3.0, "cuda": 2.0}


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


def _load_average() -> str:
    try:
        return " ".join(f"{value:.2f}" for value in os.getloadavg())
    except OSError:
        return "unknown"


def resolve_cap(case: Case, device: torch.device) -> int:
    if case.cap.startswith("ref:"):
        reserved = Bench(case, device).reserved_at(int(case.cap.partition(":")[2]))
        return int(math.ceil(reserved / 2**20) * 2**20)
    return parse_bytes(case.cap, name="cap")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda[:N]")
    parser.add_argument("--quick", action="store_true", help="fewer cases")
    parser.add_argument(
        "--truth",
        choices=("scan", "bisect"),
        default=None,
        help="how the true maximum is found (default: scan on the CPU, bisect on CUDA)",
    )
    parser.add_argument("--workloads", default=None, help="comma-separated workloads (default: all)")
    parser.add_argument("--json", type=Path, default=None, help="results file (default bench/results/...)")
    parser.add_argument("--no-json", action="store_true", help="do not write the results file")
    parser.add_argument(
        "--repeat", type=int, default=1, help="run each search N times and report the median time"
    )
    args = parser.parse_args(argv)
    device = parse_device(args.device)
    kind = device.type
    cases = (QUICK if args.quick else CASES)[kind]
    if args.workloads is not None:
        wanted = args.workloads.split(",")
        unknown = sorted(set(wanted) - {case.workload for case in CASES[kind]})
        if unknown:
            parser.error(f"unknown workload(s) {', '.join(unknown)} on {kind}")
        cases = [case for case in cases if case.workload in wanted]
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")

    began = time.perf_counter()
    found = ", ".join(f"{name} {version or 'not installed'}" for name, version in versions().items())
    where = torch.cuda.get_device_name(device) if kind == "cuda" else f"{torch.get_num_threads()} threads"
    print(f"{found}; {where}; load average {_load_average()}")
    competitors = available_competitors(device)
    quiet_competitors()  # after their imports, which set their loggers' levels
    rows: list[Row] = []
    for case in cases:
        why = _workloads.missing(case.workload)
        if why is not None:
            print(f"{case.name}: skipped: {why}")
            continue
        warm_up(Bench(case, device))
        bench = Bench(case, device, resolve_cap(case, device))
        print(f"{case.name} at {case.cap} ({format_bytes(bench.cap_bytes)}):", flush=True)
        rows.append(
            bench_one(bench, competitors, args.repeat, args.truth or ("bisect" if kind == "cuda" else "scan"))
        )

    print()
    tables.print_text_table(headers(), table_rows(rows))
    print()
    print_summary(rows, kind)
    total = time.perf_counter() - began
    print(f"total wall time {total:.0f} s; load average {_load_average()} (1, 5, 15 min)")
    print()
    tables.print_markdown_table(headers(), table_rows(rows), text_columns=(0, 1))
    if not args.no_json:
        path = args.json or RESULTS / f"find-{kind}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        payload = {
            "device": str(device),
            "steps_per_trial": STEPS_PER_TRIAL,
            "max_batch": MAX_BATCH,
            "repeat": args.repeat,
            "versions": versions(),
            "total_seconds": total,
            "load_average_at_end": _load_average(),
            "rows": [asdict(row) for row in rows],
        }
        path.write_text(json.dumps(payload, indent=1))
        print(f"\nwrote {path}")
    return 0 if all(row.batchfit.answer == row.truth.true_max for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

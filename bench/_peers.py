"""The peers ``bench/find.py`` compares batchfit with: Lightning's batch-size tuner and
accelerate's ``find_executable_batch_size``, each running the same capped trial as batchfit."""

from __future__ import annotations

import inspect
import logging
import tempfile
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import _workloads
import torch
from _capped import MAX_BATCH_SIZE, STEPS_PER_TRIAL, Bench, Case, MethodResult
from _harness import Stopwatch

from batchfit import Workload
from batchfit.runtime.workloads.batches import to_device

LIGHTNING_INIT_VAL = 2


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
    from lightning.pytorch.tuner import batch_size_scaling

    workload, state = bench.workload()
    module = _lightning_module(bench, workload, state.optimizer)
    sizes: list[int] = []
    peaks: dict[int, int] = {}
    original = batch_size_scaling._try_loop_run

    def capped_try_loop_run(trainer: Any, params: dict[str, Any]) -> None:
        batch_size = module.batch_size
        sizes.append(batch_size)
        state.reset()
        with bench.capped(state) as measurement:
            original(trainer, params)
        peaks[batch_size] = measurement.peak_bytes

    with tempfile.TemporaryDirectory() as root:
        tuner, options = _lightning_tuner(bench, root)
        batch_size_scaling._try_loop_run = capped_try_loop_run
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # Lightning's advice on workers, logging intervals...
                with Stopwatch() as watch:
                    answer = tuner.scale_batch_size(module, **options)
        finally:
            batch_size_scaling._try_loop_run = original
    return MethodResult(answer, sizes, watch.seconds, watch.cpu_seconds, peaks)


def _lightning_module(bench: Bench, workload: Workload, optimizer: torch.optim.Optimizer) -> Any:
    """The workload as a LightningModule with manual optimization: each step zeroes the gradients,
    steps on the workload's loss and steps ``optimizer``; its data loader yields STEPS_PER_TRIAL
    copies of the trial's host batch, made outside the cap when Lightning sets ``batch_size``."""
    import lightning.pytorch as pl

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

    return LitWorkload()


def _lightning_tuner(bench: Bench, root: str) -> tuple[Any, dict[str, Any]]:
    """Lightning's Tuner on a one-epoch Trainer for the bench's device and precision, writing under
    ``root``, and the binsearch's options (its margin 0 where Lightning has one)."""
    import lightning.pytorch as pl
    from lightning.pytorch.tuner.tuning import Tuner

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
    return tuner, options


def run_accelerate(bench: Bench) -> MethodResult:
    """accelerate's decorator from MAX_BATCH_SIZE down; each call of the inner function is a trial."""
    from accelerate.utils import find_executable_batch_size

    workload, state = bench.workload()
    sizes: list[int] = []
    peaks: dict[int, int] = {}

    @find_executable_batch_size(starting_batch_size=MAX_BATCH_SIZE)  # type: ignore[untyped-decorator]
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


def _cap_error(device: torch.device, kind: str | None) -> RuntimeError:
    """The error the bench's cap raises (the kind's device: ``cpu-caching`` has its own), to check
    that each competitor recognises it as an OOM."""
    target = Bench(Case("mlp", "1KiB"), device, kind=kind).target(1024)
    try:
        with target.measure([], 1024):
            torch.ones(2**20, device=device)
    except RuntimeError as error:
        return error
    raise AssertionError("a 4 MiB tensor fitted a 1 KiB cap")


def available_competitors(device: torch.device, kind: str | None = None) -> dict[str, bool]:
    """Which competitors can run: importable, and recognising the cap's error as out of memory."""
    error = _cap_error(device, kind)
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
    """Silence the competitors' logging and warnings (call after their imports, which set levels)."""
    for name in ("lightning", "lightning.pytorch", "lightning.fabric", "pytorch_lightning", "accelerate"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", module=r"lightning(\..*)?")
    warnings.filterwarnings("ignore", message=r".*(num_workers|does not have many workers).*")

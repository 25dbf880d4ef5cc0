"""Predicted trials: the real step run on fake tensors, so peaks are traced without allocating.

On the CPU, the storage tracker under ``FakeTensorMode`` reports the same peak, to the byte, as
the real step, in a fraction of a second and whatever the batch size. ``forecast_search`` runs
the search on these predictions to place the real trials, which still confirm the answer.
"""

from __future__ import annotations

import copy
import logging
import warnings
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeCopyMode,
    FakeTensorMode,
    unset_fake_temporarily,
)

from batchfit.policy.search.search import Candidates, SearchOutcome, search
from batchfit.policy.search.trial import Mode, Trial
from batchfit.policy.search.trial_cache import TrialCache
from batchfit.runtime.devices.device import CpuDevice, Device
from batchfit.runtime.devices.host import host_memory
from batchfit.runtime.devices.host_failure import host_ran_out
from batchfit.runtime.steps.reach import grad_scalers
from batchfit.runtime.steps.runner import judge
from batchfit.runtime.steps.saved import ScalerState
from batchfit.runtime.steps.stepping import StepSpec, run_steps
from batchfit.runtime.workloads.batches import to_device
from batchfit.runtime.workloads.workload import Workload

logger = logging.getLogger(__name__)


class TraceUnavailable(Exception):
    """The workload cannot be traced on fake tensors (data-dependent code, say); run it for real."""


class FakeTracer:
    """``tracer(batch_size)`` is the trial the real step would make, traced on fake tensors.

    One fake copy of the model and optimizer serves every call. With ``warm_batch``, a first,
    unmeasured train step creates the optimizer state (and, for eval inside training, the
    gradients), after which each call traces one steady-state step: the step whose peak a real
    trial's second step measures. Without it, each call traces a first step.
    """

    def __init__(self, workload: Workload, mode: Mode, budget_bytes: int, warm_batch: int | None) -> None:
        self.workload, self.mode = workload, mode
        self.budget_bytes, self.warm_batch = budget_bytes, warm_batch
        self.fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
        self.session: tuple[Workload, torch.optim.Optimizer | None] | None = None
        # The copy is the model's and optimizer's alone: a GradScaler the step uses is the user's
        # own, and a traced step would leave fake tensors in it (put back after each trace).
        self.scalers = grad_scalers(workload.train_step, workload.eval_step)

    def __call__(self, batch_size: int) -> Trial:
        host_batch = self.workload.host_batch(batch_size)
        with tracing(self.fake_mode, self.scalers):
            fake, optimizer = self.session or self._start()
            if self.mode == "train":  # a real trial's steps start after zero_grad
                for parameter in fake.model.parameters():
                    parameter.grad = None
                if self.warm_batch is None and optimizer is not None:  # a first step: no state yet
                    optimizer.state.clear()
            spec = StepSpec(fake, CpuDevice(fake=True), self.mode, steps=1)
            measurement, _ = run_steps(spec, optimizer, host_batch)
        return judge(batch_size, measurement, None, self.budget_bytes)

    def _start(self) -> tuple[Workload, torch.optim.Optimizer | None]:
        """The fake copy of the model and optimizer, warmed up by a train step where asked."""
        fake = fake_copy(self.workload, self.fake_mode)
        optimizer = fake.build_optimizer()
        if self.warm_batch is not None and (optimizer is not None or fake.train_step is not None):
            fake.module.train()
            fake.run_train_step(
                optimizer, to_device(self.workload.host_batch(self.warm_batch), torch.device("cpu"))
            )
        self.session = fake, optimizer
        return self.session


@contextmanager
def tracing(fake_mode: FakeTensorMode, scalers: Iterable[torch.amp.GradScaler] = ()) -> Iterator[None]:
    """A block that runs the step on fake tensors: inside ``fake_mode``, the RNG forked (a fake
    dropout draws nothing real, but the block leaves the generator as it found it), the ``scalers``
    (the user's own GradScalers, which a traced step leaves fake tensors in) put back after it;
    anything a fake tensor cannot do raises ``TraceUnavailable``, saying why."""
    saved = [ScalerState.capture(scaler) for scaler in scalers]
    try:
        # What the step warns of on fake tensors (a scheduler whose real optimizer did not step)
        # is not the user's to read: the real trials warn of what is.
        with fake_mode, torch.random.fork_rng(devices=[]), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    except Exception as error:  # anything a fake tensor cannot do: fall back to real trials
        logger.info("fake-tensor trace unavailable (%s: %s)", type(error).__name__, error)
        raise TraceUnavailable(_cannot_trace(error)) from error
    finally:
        for scaler in saved:
            scaler.restore()


def fake_copy(workload: Workload, fake_mode: FakeTensorMode) -> Workload:
    """``workload`` with a fake copy (in ``fake_mode``) of its model and optimizer, the originals
    untouched: their 0-dim tensors (``_scalars``) become fakes that keep their values, and a tensor
    on the meta device (a model built there, too large to allocate) a fake CPU tensor of its shape."""
    real_optimizer = workload.optimizer if isinstance(workload.optimizer, torch.optim.Optimizer) else None
    with unset_fake_temporarily():  # the values are read from the real tensors
        scalars = _scalars(workload)
    with fake_mode:
        memo: dict[int, Any] = {
            id(tensor): torch.tensor(value, dtype=tensor.dtype) for tensor, value in scalars
        }
        memo.update(_off_meta(workload.module))
    with FakeCopyMode(fake_mode):
        model, optimizer = copy.deepcopy((workload.module, real_optimizer), memo)
        if optimizer is not None:
            # An optimizer pickles its defaults, state and groups alone; what a subclass keeps
            # beside them (L-BFGS: its parameters as ``_params``) is copied onto the fakes too.
            # Not ``step``: an LR scheduler's wrapper of it, which steps the real optimizer.
            for name, value in vars(real_optimizer).items():
                if name not in vars(optimizer) and name != "step":
                    setattr(optimizer, name, copy.deepcopy(value, memo))
    return workload.replaced(model=model, optimizer=optimizer or workload.optimizer)


def _off_meta(module: torch.nn.Module) -> dict[int, torch.Tensor]:
    """A fake CPU twin (inside the fake mode) of each of ``module``'s parameters and buffers on the
    meta device, by the original's id: what ``copy.deepcopy`` puts in the copy's place."""
    twins: dict[int, torch.Tensor] = {}
    for tensor in [*module.parameters(), *module.buffers()]:
        if tensor.device.type == "meta" and id(tensor) not in twins:
            twin = torch.empty_strided(tensor.shape, tensor.stride(), dtype=tensor.dtype, device="cpu")
            if isinstance(tensor, torch.nn.Parameter):
                twin = torch.nn.Parameter(twin, requires_grad=tensor.requires_grad)
            twins[id(tensor)] = twin
    return twins


def _cannot_trace(error: Exception) -> str:
    """Why a fake tensor could not run the step, in a line: the error, and what it means where it is
    the step reading a value a fake tensor does not have."""
    lines = str(error).strip().splitlines()
    said = f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__
    if isinstance(error, (DataDependentOutputException, DynamicOutputShapeException)):
        return f"it reads a tensor's value, as .item(), float() or a shape set by the data do: {said}"
    return said


def _scalars(workload: Workload) -> list[tuple[torch.Tensor, Any]]:
    """The 0-dim tensors in the optimizer's state (its ``step`` counters, NAdam's ``mu_product``)
    and the model's buffers (BatchNorm's ``num_batches_tracked``), with their values: the fake copy
    makes them fakes that keep their value. An optimizer that has stepped reads its ``step``
    (Adam's bias correction: ``step.item()``), which a fake copied from a tensor cannot answer and
    a fake made from a number, as a fresh optimizer's is, can."""
    optimizer = workload.optimizer if isinstance(workload.optimizer, torch.optim.Optimizer) else None
    state = optimizer.state.values() if optimizer is not None else ()
    held = [value for each in state for value in each.values()] + list(workload.module.buffers())
    return [
        (tensor, tensor.item())
        for tensor in held
        if type(tensor) is torch.Tensor and tensor.dim() == 0 and tensor.device.type == "cpu"
    ]


def untraceable(workload: Workload) -> str:
    """Why a trace of ``workload``'s step would not size the real step, in a clause ("" where none)."""
    if workload.compiled:
        return (
            f"the step runs torch.compile'd code ({', '.join(workload.compiled)}), which Dynamo "
            f"runs eagerly under fake tensors: a trace would size its eager twin"
        )
    if workload.reached:  # the fakes are the model's and optimizer's: a step's other state would
        # take fake tensors (a discriminator's optimizer its state) and go uncounted
        reached = ", ".join(type(each).__name__ for each in workload.reached)
        return (
            f"the step updates state beside the model and optimizer ({reached}), which a fake "
            f"copy of the model and optimizer would not count"
        )
    return ""


@dataclass(frozen=True)
class TraceForecast:
    """The search run on fake-tensor traces (``outcome``), or why none was (``skipped``)."""

    outcome: SearchOutcome | None = None
    #: Why no forecast placed the trials on a device that traces (CPU devices), in a clause; "" where
    #: one did, or where the device does not trace (CUDA: its allocator's requests are replayed).
    skipped: str = ""


def forecast_search(
    workload: Workload,
    device: Device,
    mode: Mode,
    steps: int,
    budget: int,
    warm_batch: int | None,
    candidates: Candidates,
    cache: TrialCache | None,
) -> TraceForecast:
    """The search run on fake-tensor traces (CPU devices only): where the real trials should go.

    Tracing allocates nothing and costs the same at any batch size; on the CPU it predicts the
    tracked peak to the byte. No outcome where the device cannot be traced (no reason given) or
    the workload cannot be (the reason given).
    """
    if not isinstance(device, CpuDevice):
        # Fake CUDA tensors with autograd are not safe on every build; CUDA runs for real.
        return TraceForecast()
    skipped = untraceable(workload)
    if skipped:
        return TraceForecast(skipped=skipped)
    # Train: the real trial's last step runs with optimizer state, so the trace warms up first
    # (unless a trial is a single, first step). Eval: as the real trial does.
    warm = candidates.first if mode == "train" and steps > 1 else warm_batch
    tracer = FakeTracer(workload, mode, budget, warm)
    host = host_memory()

    def trace(batch_size: int) -> Trial:
        reused = cache.lookup_predicted(batch_size, budget) if cache is not None else None
        if reused is not None:
            return reused
        try:
            trial = tracer(batch_size)
        except Exception as error:  # the host batch is real: the host's memory can run out
            ran_out = host_ran_out(error, device, budget, host, batch_size, "making its batch for the trace")
            if ran_out is None:
                raise
            raise ran_out from error
        if cache is not None:
            cache.predicted[batch_size] = trial
            cache.traces += 1
        return trial

    try:
        return TraceForecast(search(trace, candidates, budget, forecast_only=True))
    except TraceUnavailable as error:
        return TraceForecast(skipped=f"the step cannot run on fake tensors ({error})")

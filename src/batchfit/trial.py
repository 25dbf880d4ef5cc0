"""One trial: real steps of the workload at a batch size, measured, and the state put back."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from batchfit.device import Device, Measurement
from batchfit.oom import is_out_of_memory
from batchfit.search import Outcome, Trial
from batchfit.state import TrainingSnapshot
from batchfit.tracker import resident_tensors
from batchfit.units import format_bytes
from batchfit.workload import Workload, to_device

Mode = Literal["train", "eval"]


def run_steps(
    workload: Workload,
    optimizer: torch.optim.Optimizer | None,
    device: Device,
    mode: Mode,
    host_batch: Any,
    steps: int,
    warm_batch: int | None,
    cap_bytes: int | None = None,
    started: list[Measurement] | None = None,
) -> tuple[Measurement, float | None]:
    """Run ``steps`` steps of ``mode`` on copies of ``host_batch`` under a hard cap of ``cap_bytes``
    (none when None); the measurement of the last step and its seconds. With ``warm_batch``, an
    eval trial first makes the training state resident (gradients, optimizer state), under the
    same cap. The measurement is also appended to ``started`` as it begins, so a failure can
    read it."""
    resident = list(resident_tensors(workload.model, optimizer))
    step_seconds: float | None = None
    with device.measure(resident, cap_bytes) as measurement, _optimizer_phases(measurement):
        if started is not None:
            started.append(measurement)
        if mode == "eval" and warm_batch is not None and optimizer is not None:
            # Validation inside training runs with gradients and optimizer state resident.
            workload.model.train()
            workload.run_train_step(
                optimizer, to_device(workload.host_batch(warm_batch), device.torch_device)
            )
        workload.model.train(mode == "train")
        for _ in range(steps):
            measurement.begin_step()
            batch = to_device(host_batch, device.torch_device)
            begin = time.perf_counter()
            if mode == "train":
                workload.run_train_step(optimizer, batch)
            else:
                workload.run_eval_step(batch)
            device.synchronize()
            step_seconds = time.perf_counter() - begin
            del batch
    return measurement, step_seconds


def judge(batch_size: int, measurement: Measurement, step_seconds: float | None, budget_bytes: int) -> Trial:
    """The trial a completed measurement makes: ok if its peak is within the budget, else over
    budget. (A trial that completed under a cap at the budget is within it.)"""
    outcome, detail = _verdict(measurement.peak_bytes, budget_bytes)
    return Trial(
        batch_size,
        outcome,
        measurement.peak_bytes,
        step_seconds,
        detail,
        optimizer_peak_bytes=measurement.optimizer_peak_bytes,
        activation_peak_bytes=measurement.activation_peak_bytes,
        allocator_retries=measurement.allocator_retries,
        reserved_peak_bytes=measurement.reserved_peak_bytes,
    )


def _verdict(peak_bytes: int, budget_bytes: int) -> tuple[Outcome, str]:
    if peak_bytes > budget_bytes:
        return "over_budget", f"peak {format_bytes(peak_bytes)} > budget {format_bytes(budget_bytes)}"
    return "ok", ""


@dataclass
class TrialCache:
    """Trials measured on one workload, mode and device, to be judged again against another budget.

    A real trial ran under a cap at its search's budget. One that completed fits any larger
    budget, and a smaller one that its peaks stay within (the reserved peak where the device
    caches: below it the allocator would have behaved the same); its allocated peak past a budget
    is over that budget. One that ran out of memory fails any budget as small. Anything else is
    run again. A trace (``predicted``) ran uncapped, so its peak is judged against any budget.
    """

    real: dict[int, tuple[Trial, int]] = field(default_factory=dict)  # batch -> (trial, its cap)
    predicted: dict[int, Trial] = field(default_factory=dict)
    runs: int = 0  # real trials actually run
    traces: int = 0  # fake-tensor traces actually run

    def lookup_real(self, batch_size: int, budget_bytes: int) -> Trial | None:
        """The real trial at ``batch_size`` as it would come out under ``budget_bytes``; None
        when it was not measured or its measurement does not decide."""
        if batch_size not in self.real:
            return None
        trial, cap = self.real[batch_size]
        if trial.outcome == "oom":
            return replace(trial, reused=True) if budget_bytes <= cap else None
        held = trial.peak_bytes if trial.reserved_peak_bytes is None else trial.reserved_peak_bytes
        if budget_bytes >= cap or held <= budget_bytes:
            return replace(trial, outcome="ok", detail="", reused=True)
        if trial.peak_bytes > budget_bytes:
            outcome, detail = _verdict(trial.peak_bytes, budget_bytes)
            return replace(trial, outcome=outcome, detail=detail, reused=True)
        return None

    def lookup_predicted(self, batch_size: int, budget_bytes: int) -> Trial | None:
        cached = self.predicted.get(batch_size)
        if cached is None:
            return None
        outcome, detail = _verdict(cached.peak_bytes, budget_bytes)
        return replace(cached, outcome=outcome, detail=detail, reused=True)


class TrialRunner:
    """Runs real trials on a device under a hard cap at the budget, each from the workload's
    resident state, restoring the snapshot after each, failed or not.

    The verdict is whether the steps complete under the cap: a batch that does not fit fails at
    its real allocation, as it would in training on a device of ``budget_bytes``; allocator
    retries on the way are evidence (they cost speed), not a failure.
    """

    def __init__(
        self,
        workload: Workload,
        device: Device,
        mode: Mode,
        steps: int,
        budget_bytes: int,
        snapshot: TrainingSnapshot,
        warm_batch: int | None,
    ) -> None:
        self.workload, self.device, self.mode, self.steps = workload, device, mode, steps
        self.budget_bytes, self.snapshot, self.warm_batch = budget_bytes, snapshot, warm_batch

    def run(self, batch_size: int) -> Trial:
        workload = self.workload
        host_batch = workload.host_batch(batch_size)  # outside the measurement: data-loader memory
        self.device.release()  # nothing an earlier trial (or the caller) left cached counts here
        started: list[Measurement] = []
        step_seconds, failure = None, ""
        try:
            _, step_seconds = run_steps(
                workload,
                workload.build_optimizer(),
                self.device,
                self.mode,
                host_batch,
                self.steps,
                self.warm_batch,
                self.budget_bytes,
                started,
            )
        except BaseException as error:
            if not is_out_of_memory(error):
                error.add_note(f"batchfit: raised by the {self.mode} step at batch_size={batch_size}.")
                raise
            failure = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        finally:
            self.snapshot.restore(gradients=False)
        measurement = started[0] if started else Measurement()
        if failure:
            self.device.release()
            return Trial(
                batch_size,
                "oom",
                measurement.peak_bytes,
                None,
                failure,
                allocator_retries=measurement.allocator_retries,
                reserved_peak_bytes=measurement.reserved_peak_bytes,
            )
        return judge(batch_size, measurement, step_seconds, self.budget_bytes)


@contextmanager
def _optimizer_phases(measurement: Measurement) -> Iterator[None]:
    """Tell the measurement when any optimizer's step starts and ends (global hooks, removed after)."""
    before = register_optimizer_step_pre_hook(lambda *_: measurement.enter_optimizer_step())
    after = register_optimizer_step_post_hook(lambda *_: measurement.exit_optimizer_step())
    try:
        yield
    finally:
        before.remove()
        after.remove()

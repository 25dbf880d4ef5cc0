"""Trials: ``TrialRunner`` runs a workload's steps at a batch size under a hard cap at the budget
(``run_steps``), judges what they measured, and puts the workload's state back after each."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, TypedDict

import torch
from typing_extensions import Unpack

from batchfit.policy.search.trial import Mode, Trial
from batchfit.policy.search.trial_cache import verdict
from batchfit.policy.search.trial_records import TrialRecords
from batchfit.runtime.devices.device import Device
from batchfit.runtime.devices.host import host_memory
from batchfit.runtime.devices.host_failure import host_ran_out
from batchfit.runtime.devices.measurement import Measurement
from batchfit.runtime.devices.oom import is_out_of_memory
from batchfit.runtime.steps.finite import LossLog, check_finite
from batchfit.runtime.steps.state import TrainingSnapshot
from batchfit.runtime.steps.stepping import OVERFLOW_STEPS, StepSpec, run_steps, scaled_down
from batchfit.runtime.workloads.workload import Workload


class Taking(TypedDict, total=False):
    """How a runner's steps end and what they take down (``StepSpec``'s fields of those names)."""

    until_steady: bool  # end where the allocator's state recurs (default True)
    record: bool  # take the allocator's requests down (default False)
    record_steps: int | None  # record the first this many steps only (default None: all)


_TAKING = ", ".join(f"{name}=" for name in Taking.__annotations__)


def snapshot_scalers(snapshot: TrainingSnapshot) -> tuple[torch.amp.GradScaler, ...]:
    """The step's GradScalers, as the snapshot found them: it puts them back, the trials read them."""
    return tuple(state.scaler for state in snapshot.scalers)


def judge(batch_size: int, measurement: Measurement, step_seconds: float | None, budget_bytes: int) -> Trial:
    """The trial a completed measurement makes: ok if its peak is within the budget, else over
    budget. (A trial that completed under a cap at the budget is within it.)"""
    outcome, detail = verdict(measurement.peak_bytes, budget_bytes)
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


class TrialRunner:
    """Runs real trials on a device under a hard cap at the budget, each from the workload's
    resident state, restoring the snapshot after each, failed or not.

    The verdict is whether the steps complete under the cap: a batch that does not fit fails at
    its real allocation, as it would in training on a device of ``budget_bytes``; allocator
    retries on the way are evidence (they cost speed), not a failure. On a caching allocator the
    steps end where its state recurs (``until_steady``): the steps left would repeat earlier ones.
    With ``record``, each trial that fits adds its allocator requests (of its first
    ``record_steps`` steps, None: all) to ``records`` (``policy.search.trial_records.TrialRecords``), for
    ``policy.allocator.allocation_replay`` to forecast other sizes. What does not change from trial to trial
    is its ``spec`` (``StepSpec``), capped at its ``cap_bytes``, the budget.
    """

    def __init__(
        self,
        spec: StepSpec,
        snapshot: TrainingSnapshot,
        records: TrialRecords | None = None,
    ) -> None:
        if spec.cap_bytes is None:
            raise ValueError("a trial runs under a cap: StepSpec.cap_bytes is the budget")
        self.spec, self.snapshot, self.budget_bytes = spec, snapshot, spec.cap_bytes
        # Where its fitting trials leave their requests: the search's, handed to each of its
        # runners and to its replay (a ``TrialCache``'s, where searches share one), or its own.
        self.records = TrialRecords() if records is None else records
        self.host = host_memory()  # what the host can give the trials, named where it runs out

    @classmethod
    def on(
        cls,
        workload: Workload,
        device: Device,
        mode: Mode,
        steps: int,
        budget_bytes: int,
        snapshot: TrainingSnapshot,
        warm_batch: int | None,
        **taking: Unpack[Taking],
    ) -> TrialRunner:
        """A runner of ``steps`` steps of ``mode`` on ``device`` under a cap at ``budget_bytes``;
        ``taking``: how the steps end and what they record (``Taking``)."""
        unknown = sorted(set(taking) - Taking.__optional_keys__)
        if unknown:
            raise TypeError(f"TrialRunner.on() takes no {', '.join(unknown)}: its keywords are {_TAKING}.")
        return cls(
            StepSpec(
                workload,
                device,
                mode,
                steps,
                warm_batch=warm_batch,
                cap_bytes=budget_bytes,
                until_steady=taking.get("until_steady", True),
                record=taking.get("record", False),
                record_steps=taking.get("record_steps"),
                scalers=snapshot_scalers(snapshot),
            ),
            snapshot,
        )

    @property
    def mode(self) -> Mode:
        return self.spec.mode

    def run(self, batch_size: int) -> Trial:
        try:  # outside the measurement: data-loader memory
            host_batch = self.spec.workload.host_batch(batch_size)
        except Exception as error:
            device = self.spec.device
            host = host_ran_out(error, device, self.budget_bytes, self.host, batch_size, "making its batch")
            if host is None:
                raise
            raise host from error
        scalers = self.spec.scalers
        scales = [scaler.get_scale() for scaler in scalers]
        trial, stepped = self._attempt(batch_size, host_batch)
        if trial.fits and stepped and scaled_down(scalers, scales):
            # Its GradScaler skipped steps for overflow (a fresh scaler's first steps do) before
            # the optimizer stepped, and every later trial starts from the scale it came down to
            # (the scale is not put back): their steps hold the optimizer's state from the first.
            # Run again from there, so that this trial's peak and recorded requests are theirs:
            # the first attempt's ran other steps, and its requests do not align with theirs, so
            # replayed beside theirs they forecast nothing. The same steps on the same batch from
            # the same weights do not overflow again.
            self.records.discard(batch_size)
            trial, _ = self._attempt(batch_size, host_batch)
        return trial

    def _attempt(self, batch_size: int, host_batch: Any) -> tuple[Trial, bool]:
        """The trial, and whether an optimizer stepped in it; a ``NonFiniteError`` where its steps
        did not train (``runtime.steps.finite``)."""
        spec = self.spec
        spec.device.release()  # nothing an earlier trial (or the caller) left cached counts here
        started: list[Measurement] = []
        # A trace's (fake tensors') losses have no values to read: nothing to check there.
        losses = None if spec.device.fake else LossLog(spec.device.torch_device, spec.steps + OVERFLOW_STEPS)
        step_seconds, failure = None, ""
        try:
            _, step_seconds = run_steps(spec, spec.workload.build_optimizer(), host_batch, started, losses)
        except BaseException as error:
            self._stop_where_the_host_ran_out(error, batch_size, started)
            out_of_memory = _out_of_memory(error, started)
            if out_of_memory is None:
                if isinstance(error, Exception):  # not a Ctrl-C: that interrupts, it is not raised by a step
                    error.add_note(self._raised_at(batch_size, started[0].steps if started else 0))
                raise
            failure = out_of_memory
        else:  # the trial's tensors are read before the snapshot puts the model back
            if losses is not None:
                scaled = bool(spec.scalers)
                check_finite(spec.workload.module, spec.mode, scaled, losses, batch_size, started[0].steps)
        finally:
            self.snapshot.restore(gradients=False, scales=False)
        measurement = started[0] if started else Measurement()
        stepped = measurement.optimizer_steps > 0
        if failure:
            spec.device.release()
            return self._failed(batch_size, measurement, failure), stepped
        trial = judge(batch_size, measurement, step_seconds, self.budget_bytes)
        record = measurement.recording.record(batch_size) if measurement.recording is not None else None
        if record is not None and trial.fits:
            self.records.add(record)
        return replace(trial, steps=measurement.steps, steady_from=measurement.steady_from), stepped

    def _stop_where_the_host_ran_out(
        self, error: BaseException, batch_size: int, started: list[Measurement]
    ) -> None:
        """Raise ``HostOutOfMemoryError`` where the steps failed in the host's own allocator before
        batchfit's cap refused anything, on a device whose budget is not the host's memory: the
        machine ran out, and no verdict on the budget can be read from it."""
        if started and started[0].refused:
            return  # the cap refused first: the budget's out-of-memory, whatever followed it
        step, spec = (started[0].steps if started else 0), self.spec
        of = f" of {spec.steps}" if step <= spec.steps else ""
        where = f"{spec.mode} step {max(step, 1)}{of}"
        if step == 0 and spec.mode == "eval" and spec.warm_batch is not None:
            where = f"the train step that makes the training state, batch_size={spec.warm_batch}"
        host = host_ran_out(error, self.spec.device, self.budget_bytes, self.host, batch_size, where)
        if host is not None:
            raise host from error

    def _raised_at(self, batch_size: int, step: int) -> str:
        """The note on an error the steps raised: the trial's batch size, and the step that raised."""
        mode, warm = self.spec.mode, self.spec.warm_batch
        if step == 0 and mode == "eval" and warm is not None:
            return (
                f"batchfit: raised by the train step that makes the training state (batch_size={warm}) "
                f"before the eval steps at batch_size={batch_size}."
            )
        of = f" of {self.spec.steps}" if step <= self.spec.steps else ""
        return f"batchfit: raised by the {mode} step at batch_size={batch_size}, step {max(step, 1)}{of}."

    def _failed(self, batch_size: int, measurement: Measurement, failure: str) -> Trial:
        """The out-of-memory trial: the peak before it failed, and the step that ran out."""
        return Trial(
            batch_size,
            "oom",
            measurement.peak_bytes,
            None,
            failure,
            allocator_retries=measurement.allocator_retries,
            reserved_peak_bytes=measurement.reserved_peak_bytes,
            steps=self.spec.steps,
            failed_at_step=measurement.steps,
        )


def _out_of_memory(error: BaseException, started: list[Measurement]) -> str | None:
    """What an out-of-memory of the steps says (its first line), or the cap's own message where what
    reached here lost it (TorchScript re-raises it empty); None for any other error."""
    refused = started[0].refused if started else ""
    if is_out_of_memory(error):
        text = str(error).strip()
        return text.splitlines()[0] if text else type(error).__name__
    if refused and isinstance(error, RuntimeError):
        return refused
    return None

"""The capacity a search is given on its device, and the refusal where even its smallest candidate
does not fit there: what it measured, and what to change."""

from __future__ import annotations

from batchfit.errors import DoesNotFitError
from batchfit.policy.search.trial import Mode, Trial
from batchfit.runtime.devices.host_failure import check_host_room
from batchfit.runtime.devices.tracker import resident_tensors
from batchfit.runtime.workloads.workload import Workload
from batchfit.units import format_bytes
from batchfit.where import ResolvedDevice


def search_capacity(workload: Workload, target: ResolvedDevice, candidates: int) -> int:
    """The device's capacity for this workload: what its resident tensors leave room for. A search
    over ``candidates`` sizes on the CPU standing in for a larger device is refused where the host
    cannot give its budget (``check_host_room``); one size (``check``) runs, as its trial needs
    only its own peak, and stops saying so where the host runs out."""
    held = list(resident_tensors(workload.module, workload.optimizer, *workload.reached))
    capacity = target.device.capacity_bytes(held, workload.wrapper_bytes)
    if candidates > 1:
        check_host_room(target.device, capacity, target.memory_fraction, held, workload.wrapper_bytes)
    return capacity


def does_not_fit(
    workload: Workload, mode: Mode, target: ResolvedDevice, capacity: int, trial: Trial
) -> DoesNotFitError:
    """Even the smallest candidate (``trial``) failed under ``target``'s share of ``capacity``: the
    error naming what it measured, the fixed part's bytes, and what to change."""
    fraction = target.memory_fraction
    budget = int(fraction * capacity)
    weights = sum(t.untyped_storage().nbytes() for t in resident_tensors(workload.module))
    buckets = (
        f" (and DDP's gradient buckets {format_bytes(workload.wrapper_bytes)} beside them)"
        if workload.wrapper_bytes
        else ""
    )
    measured = (
        f"it ran out of memory ({trial.detail})"
        if trial.outcome == "oom"
        else f"its peak was {format_bytes(trial.peak_bytes)}"
    )
    return DoesNotFitError(
        f"the {mode} step does not fit even at batch_size={trial.batch_size} on "
        f"{target.device.name}: {measured}, against a budget of {format_bytes(budget)} "
        f"({fraction:g} x {format_bytes(capacity)}). The fixed part alone, parameters and "
        f"buffers, takes {format_bytes(weights)}{buckets} before gradients, optimizer state and "
        f"activations. Raise memory_limit, or memory_fraction={fraction:g} toward 1, or shrink "
        f"the fixed part (mixed precision, a lighter optimizer, activation checkpointing).",
        trial=trial,
        budget_bytes=budget,
        capacity_bytes=capacity,
    )

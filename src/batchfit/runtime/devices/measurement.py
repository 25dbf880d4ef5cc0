"""What a device saw during one trial (``Measurement``): the last step's allocated peaks inside and
outside the optimizer's step, read from a ``Probe``; for a CPU step that runs compiled code, read
from the allocator's events instead (``profiled``, ``runtime.steps.compiled``)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

import torch

from batchfit.policy.allocator.allocation_record import Recording
from batchfit.runtime.devices.host import data_limited, host_available_bytes
from batchfit.runtime.devices.tracker import resident_oom_message
from batchfit.runtime.steps.compiled import ProfiledAllocations, ProfiledSteps


class Probe(Protocol):
    """Where a device reads its memory peaks since the last reset: allocated and, for a device with
    a caching allocator, reserved bytes (None where nothing is cached)."""

    def peaks(self) -> tuple[int, int | None]: ...

    def reset(self) -> None: ...

    def refused(self) -> str:
        """The message of the last allocation batchfit's own cap refused in the block ("" where none
        did, or where the device's allocator enforces the cap itself, as CUDA's does)."""
        ...


@dataclass
class Measurement:
    """What a device saw during one trial, kept for its last (steady-state) step.

    ``begin_step`` starts a step: the first step of a trial is not its steady state (it creates
    the optimizer state, autotunes kernels, initialises libraries lazily), so only the last step's
    peaks are kept. Within a step the peak inside ``optimizer.step`` (``optimizer_peak_bytes``)
    and the peak outside it (``activation_peak_bytes``) are kept apart: the first hardly grows
    with the batch, the second does, and the memory model fits them apart.
    """

    peak_bytes: int = 0  # allocated: the larger of the two phases' peaks
    reserved_peak_bytes: int | None = None  # what the caching allocator held at most (CUDA)
    allocator_retries: int = 0  # over the whole trial
    optimizer_peak_bytes: int | None = None
    activation_peak_bytes: int | None = None
    steps: int = 0  # the steps run (to the one that failed)
    optimizer_steps: int = 0  # the optimizer steps completed, over the whole trial
    steady_from: int | None = None  # the step whose end state the last step's recurred
    recording: Recording | None = None  # the allocator's requests and frees, where recorded
    # An allocation batchfit's cap refused (the CPU devices): the trial's failure even where the
    # error that reached it lost that message (TorchScript's interpreter re-raises it empty).
    refused: str = ""
    _probe: Probe | None = None

    def begin_step(self) -> None:
        if self._probe is not None:
            self._probe.reset()
        self.optimizer_peak_bytes = self.activation_peak_bytes = self.reserved_peak_bytes = None

    def enter_optimizer_step(self) -> None:
        self.activation_peak_bytes = self._close_phase(self.activation_peak_bytes)

    def exit_optimizer_step(self) -> None:
        self.optimizer_peak_bytes = self._close_phase(self.optimizer_peak_bytes)
        self.optimizer_steps += 1

    def finish(self) -> None:
        """Close the last phase (outside any optimizer step) and stop reading the device."""
        self.enter_optimizer_step()
        self.peak_bytes = max(self.activation_peak_bytes or 0, self.optimizer_peak_bytes or 0)
        if self._probe is not None:
            self.refused = self._probe.refused()
        self._probe = None

    def _close_phase(self, so_far: int | None) -> int | None:
        if self._probe is None:
            return so_far
        allocated, reserved = self._probe.peaks()
        self._probe.reset()
        if reserved is not None:
            self.reserved_peak_bytes = max(self.reserved_peak_bytes or 0, reserved)
        return max(so_far or 0, allocated)


@dataclass
class ProfiledMeasurement(Measurement):
    """A measurement whose peaks are read from the allocator's events after the block: each call
    that would read the device drops a marker into the events instead (``ProfiledAllocations``)."""

    _allocations: ProfiledAllocations | None = None

    def begin_step(self) -> None:
        if self._allocations is not None:
            self._allocations.mark("step")

    def enter_optimizer_step(self) -> None:
        if self._allocations is not None:
            self._allocations.mark("enter")

    def exit_optimizer_step(self) -> None:
        if self._allocations is not None:
            self._allocations.mark("exit")
        self.optimizer_steps += 1

    def finish(self) -> None:
        self._allocations = None

    def read(self, steps: ProfiledSteps) -> None:
        """The last step's peaks, as the events give them (up to a refused allocation)."""
        steps.close_phase()
        self.activation_peak_bytes = steps.activation_peak_bytes
        self.optimizer_peak_bytes = steps.optimizer_peak_bytes
        self.peak_bytes = max(self.activation_peak_bytes or 0, self.optimizer_peak_bytes or 0)
        self.refused = steps.refused
        if steps.refused:
            self.steps = steps.step  # the step that ran out; the rest ran, as the profiler cannot stop one


@contextmanager
def profiled(
    resident: Iterable[torch.Tensor], cap_bytes: int | None, wrapper_bytes: int
) -> Iterator[Measurement]:
    """``CpuDevice.measure`` for a step that runs compiled code: the allocator's events, read by
    the profiler, under a cap judged on them once the block has run (``runtime.steps.compiled``)."""
    allocations = ProfiledAllocations(resident, cap_bytes, wrapper_bytes)
    del resident
    if cap_bytes is not None and allocations.resident_bytes > cap_bytes:
        raise torch.OutOfMemoryError(resident_oom_message(allocations.resident_bytes, cap_bytes))
    measurement = ProfiledMeasurement(_allocations=allocations)
    failed = False
    try:
        # The cap is judged after the steps, so a batch far past it would take the host's memory
        # meanwhile: past what the host has free, the allocator fails instead of the kernel
        # killing the process (a false failure below the cap would need that much more for glibc).
        with data_limited(host_available_bytes()), allocations:
            yield measurement
    except BaseException:
        failed = True
        raise
    finally:
        measurement.finish()
        measurement.read(allocations.steps())
    if measurement.refused and not failed:  # where the step would have failed under the cap
        raise torch.OutOfMemoryError(measurement.refused)

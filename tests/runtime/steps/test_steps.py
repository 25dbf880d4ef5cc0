"""The step runner on real tiny models: trials that end where the allocator's state recurs, step on
past overflow, and record their allocator's requests."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
import torch
from tiny_workloads import build, overflowing_workload, skipping_workload

from batchfit import Workload
from batchfit.policy.allocator.allocation_replay import AllocationReplay
from batchfit.policy.search.replay_forecast import ReplayForecast
from batchfit.policy.search.trial import Trial
from batchfit.policy.search.trial_records import TrialRecords
from batchfit.runtime.devices.caching_device import CachingCpuDevice
from batchfit.runtime.devices.device import CappedCpuDevice, CpuDevice, Device
from batchfit.runtime.steps.runner import TrialRunner, snapshot_scalers
from batchfit.runtime.steps.state import TrainingSnapshot
from batchfit.runtime.steps.stepping import OVERFLOW_STEPS, StepSpec

MiB = 2**20


def trials(
    workload: Workload, device: Device, steps: int, sizes: list[int], mode: str = "train", **options: Any
) -> list[Trial]:
    """Trials of ``steps`` steps at ``sizes``, capped at the device's capacity."""
    optimizer = workload.optimizer if isinstance(workload.optimizer, torch.optim.Optimizer) else None
    snapshot = TrainingSnapshot.capture(workload.model, optimizer, (workload.train_step, workload.eval_step))
    snapshot.set_gradients_aside()
    warm = 1 if mode == "eval" else None
    cap = device.capacity_bytes([])
    runner = TrialRunner.on(workload, device, mode, steps, cap, snapshot, warm, **options)  # type: ignore[arg-type]
    try:
        return [runner.run(size) for size in sizes]
    finally:
        snapshot.restore()


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_a_long_trial_on_a_caching_allocator_ends_where_its_state_recurs(mode: str) -> None:
    workload, device = build("cnn"), CachingCpuDevice(2**40)
    (early,) = trials(workload, device, 10, [32], mode)
    (full,) = trials(workload, device, 10, [32], mode, until_steady=False)
    assert early.steady_from is not None and early.steady_from < early.steps < 10
    assert (full.steps, full.steady_from) == (10, None)
    # Its last step is a step of the cycle: the same peaks as the tenth.
    assert (early.peak_bytes, early.reserved_peak_bytes) == (full.peak_bytes, full.reserved_peak_bytes)


def test_near_the_cap_an_early_end_gives_the_verdict_of_thirty_steps() -> None:
    workload = build("cnn")
    (reference,) = trials(workload, CachingCpuDevice(2**40), 2, [48])
    assert reference.reserved_peak_bytes is not None
    device = CachingCpuDevice(reference.reserved_peak_bytes)
    sizes = list(range(40, 60, 2))
    early = trials(workload, device, 10, sizes)
    full = trials(workload, device, 30, sizes, until_steady=False)
    assert [t.fits for t in early] == [t.fits for t in full]
    assert any(not t.fits for t in full) and any(t.fits and t.steps < 10 for t in early)


def test_a_trial_does_not_end_before_its_optimizer_has_stepped() -> None:
    # Without optimizer steps the allocator's state recurs from step 6 to 7; Adam's state, created
    # at step 9, does not fit under a 20 MiB cap. Ending at the recurrence would say it fits.
    (trial,) = trials(skipping_workload(8), CachingCpuDevice(20 * MiB), 10, [16])
    assert trial.outcome == "oom"
    (never,) = trials(skipping_workload(100), CachingCpuDevice(20 * MiB), 10, [16])
    assert never.fits and (never.steps, never.steady_from) == (10, None)


def skipped_steps(workload: Workload, batch_size: int) -> int:
    """How many steps of ``workload`` at ``batch_size`` its GradScaler skips before the first that
    steps the optimizer (counted from the optimizer's own step count)."""
    optimizer = workload.build_optimizer()
    assert optimizer is not None
    batch = workload.host_batch(batch_size)
    for skipped in range(64):
        workload.run_train_step(optimizer, batch)
        if optimizer.state:  # Adam made its state: this step was taken
            return skipped
    raise AssertionError("the scaler never stopped skipping")


def counting_steps(workload: Workload) -> list[int]:
    """``workload``'s train step, counting its calls in the list returned (one item per call)."""
    calls: list[int] = []
    step = workload.train_step
    assert step is not None

    def counted(*args: Any) -> None:
        calls.append(1)
        step(*args)

    workload.train_step = counted
    return calls


@pytest.mark.parametrize("device", [CpuDevice, lambda: CachingCpuDevice(2**40)], ids=["cpu", "caching"])
def test_a_trial_whose_scaler_skipped_every_step_steps_on_until_the_optimizer_has(
    device: Callable[[], Device],
) -> None:
    # Its 2 steps both overflow (8 do at batch 16): without Adam's state the trial would read
    # less than the same step that never overflows, and say fits where training runs out. It steps
    # on until the optimizer has stepped, then runs again from the scale it reached, as every
    # later trial starts: its steps and peak are those of a step that never overflowed.
    skipped = skipped_steps(overflowing_workload(1e3), 16)
    workload = overflowing_workload(1e3)
    calls = counting_steps(workload)
    (late,) = trials(workload, device(), 2, [16])
    # (Each on a device of its own, and the second trial: the first makes the scaler's state.)
    prompt = trials(overflowing_workload(1.0), device(), 2, [16, 16])[-1]
    assert skipped > 2 and len(calls) == (skipped + 1) + 2
    assert late.steps == prompt.steps == 2 and late.peak_bytes == prompt.peak_bytes
    # A scaler that never stops overflowing is not waited on for ever, nor run again.
    never_workload = overflowing_workload(1e30)
    never_calls = counting_steps(never_workload)
    (never,) = trials(never_workload, device(), 2, [16])
    assert never.steps == len(never_calls) == 2 + OVERFLOW_STEPS and never.peak_bytes < prompt.peak_bytes


@pytest.mark.parametrize("device", [CpuDevice, lambda: CachingCpuDevice(2**40)], ids=["cpu", "caching"])
def test_an_eval_trial_s_training_step_steps_on_until_the_optimizer_has(device: Callable[[], Device]) -> None:
    # Validation inside training has the optimizer's state resident. Its warm-up training step
    # overflowed and skipped the optimizer: Adam's state was missing, and an eval search answered
    # 680 where 386 fits.
    (late,) = trials(overflowing_workload(1e3), device(), 2, [16], "eval")
    prompt = trials(overflowing_workload(1.0), device(), 2, [16, 16], "eval")[-1]
    assert late.peak_bytes == prompt.peak_bytes
    assert late.reserved_peak_bytes == prompt.reserved_peak_bytes


def test_a_trial_run_again_from_the_scale_it_reached_records_requests_that_align_with_the_next() -> None:
    # The first attempt's skipped steps make other requests than the steps every later trial runs
    # (from the scale it reached): a replay of its record beside theirs forecast nothing.
    device = CachingCpuDevice(2**40)
    workload = overflowing_workload(1e3)
    optimizer = workload.build_optimizer()
    snapshot = TrainingSnapshot.capture(workload.model, optimizer, (workload.train_step,))
    snapshot.set_gradients_aside()
    runner = TrialRunner.on(workload, device, "train", 2, 2**40, snapshot, None, record=True)
    try:
        runner.run(16)
        runner.run(32)
    finally:
        snapshot.restore()
    assert sorted(runner.records) == [16, 32]
    assert [len(record.steps) for record in runner.records.values()] == [3, 3]  # before, and 2 steps
    replay = AllocationReplay.of(runner.records[16], runner.records[32])
    assert replay is not None and replay.fits(24, 2**40, 10) is True


def test_a_confirming_trial_records_its_first_steps_alone_as_an_opening_trial_records_them() -> None:
    # A confirming trial's record pairs with the opening's 2-step records: it takes down its first
    # 2 steps only (on CUDA each step's mark reads the allocator's history), and they are the
    # requests a 2-step trial at that size makes, while all 10 steps still run under the cap.
    device = CachingCpuDevice(2**40)
    workload = build("mlp", "adam")
    optimizer = workload.build_optimizer()
    snapshot = TrainingSnapshot.capture(workload.model, optimizer, (workload.train_step,))
    snapshot.set_gradients_aside()
    short = TrialRunner.on(workload, device, "train", 2, 2**40, snapshot, None, record=True)
    confirming = TrialRunner.on(
        workload, device, "train", 10, 2**40, snapshot, None, until_steady=False, record=True, record_steps=2
    )
    try:
        short.run(16)
        ten = confirming.run(16)
    finally:
        snapshot.restore()
    assert ten.steps == 10 and len(confirming.records[16].steps) == 3  # before, and 2 steps
    assert confirming.records[16] == short.records[16]


def test_a_search_s_runners_add_to_the_one_records_its_replay_reads() -> None:
    # As find hands them: one TrialRecords to the opening's runner, the confirming trials' runner
    # and the replay. The replay's pair is the opening's until a confirming trial fits, then its
    # record; a trial that runs out of memory adds none.
    device = CachingCpuDevice(2**40)
    workload = build("mlp", "adam")
    optimizer = workload.build_optimizer()
    snapshot = TrainingSnapshot.capture(workload.model, optimizer, (workload.train_step,))
    snapshot.set_gradients_aside()
    records = TrialRecords()
    spec = StepSpec(
        workload, device, "train", 2, cap_bytes=2**40, record=True, scalers=snapshot_scalers(snapshot)
    )
    short = TrialRunner(spec, snapshot, records)
    confirming = TrialRunner(replace(spec, steps=10, record_steps=2), snapshot, records)
    forecast = ReplayForecast(records, 2**40, 10)
    try:
        short.run(2)
        short.run(4)
        assert forecast.evidence() == (2, 4)
        confirming.run(16)
        assert forecast.evidence() == (4, 16)
        capped = TrialRunner(replace(spec, cap_bytes=2**20), snapshot, records)
        assert not capped.run(4096).fits
    finally:
        snapshot.restore()
    assert list(records) == [2, 4, 16] and short.records is confirming.records is records


@pytest.mark.parametrize(
    "device", [CachingCpuDevice(20 * MiB), CappedCpuDevice(20 * MiB)], ids=["caching", "capped"]
)
def test_a_failed_trial_names_the_step_that_ran_out(device: Device) -> None:
    # Adam's state, created at the 9th step, is what does not fit; a fitting trial names none.
    (late,) = trials(skipping_workload(8), device, 10, [16])
    assert late.outcome == "oom" and (late.failed_at_step, late.steps) == (9, 10)
    (fits,) = trials(skipping_workload(100), device, 10, [16])
    assert fits.fits and fits.failed_at_step is None
    (at_once,) = trials(build("mlp"), device, 10, [1 << 16])  # its first step's input alone is 16 MiB
    assert at_once.outcome == "oom" and at_once.failed_at_step == 1


@pytest.mark.parametrize("device", [CpuDevice(), CappedCpuDevice(2**30)], ids=["cpu", "capped-cpu"])
def test_a_trial_on_the_cpu_s_tracker_runs_every_step(device: Device) -> None:
    # Live bytes, not an allocator's state, decide there: nothing recurs, every step runs.
    (trial,) = trials(build("cnn"), device, 5, [16])
    assert trial.fits and (trial.steps, trial.steady_from) == (5, None)


def test_no_allocator_state_repeats_across_a_retry() -> None:
    # A retry gives cached segments back, and on a GPU new ones come back at addresses the layout
    # does not name: states on either side of one differ even where the layouts match.
    device = CachingCpuDevice(20 * MiB)
    with device.measure([], 20 * MiB):
        small = torch.empty(MiB // 4)  # 1 MiB: a 2 MiB segment of the small pool, cached when freed
        del small
        before = device.allocator_state()
        large = torch.empty(MiB // 2)  # 2 MiB: a 20 MiB segment; the small one is given back first
        del large
        small = torch.empty(MiB // 4)  # a small segment again; the large one is given back first
        del small
        after = device.allocator_state()
    assert device.allocator.retries() == 2
    assert after[1] == before[1] and after != before  # type: ignore[index]


def test_a_runner_s_keywords_are_the_spec_s_and_another_is_named() -> None:
    workload = build("mlp")
    snapshot = TrainingSnapshot.capture(workload.model, workload.build_optimizer(), ())
    device = CappedCpuDevice(2**30)
    runner = TrialRunner.on(workload, device, "eval", 3, 2**20, snapshot, 4, record=True, record_steps=2)
    assert runner.spec == StepSpec(
        workload,
        device,
        "eval",
        3,
        warm_batch=4,
        cap_bytes=2**20,
        until_steady=True,
        record=True,
        record_steps=2,
    )
    assert not TrialRunner.on(
        workload, device, "train", 2, 2**20, snapshot, None, until_steady=False
    ).spec.until_steady
    named = "TrialRunner.on() takes no recrd: its keywords are until_steady=, record=, record_steps=."
    with pytest.raises(TypeError, match=f"^{re.escape(named)}$"):
        TrialRunner.on(workload, device, "train", 2, 2**20, snapshot, None, recrd=True)  # type: ignore[call-arg]

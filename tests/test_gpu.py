"""Capped trials against the truth, on every device: the CPU runs each test here, CUDA too where
there is one (marker ``gpu``), and most also on the CPU with CUDA's caching allocator modelled
(``cpu-caching``: the CUDA device's own measure and release, on the CPU's real allocations). The
truth is the user's question answered by force: the largest batch whose steps complete under the
same hard cap, each probe from the freshly built state with the allocator's cache emptied."""

from __future__ import annotations

import gc
import json
import math
import os
import random
import subprocess
import sys
import weakref
from typing import Any

import pytest
import torch
from compiled_workloads import make_batch as pointwise_batch
from compiled_workloads import pointwise_model
from tiny_workloads import adversarial, skipping_workload
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import _get_current_dispatch_mode

import batchfit
from batchfit import BatchSizes, SearchResult, Timing, Workload, find_batch_size
from batchfit.errors import NonFiniteError
from batchfit.policy.allocator.allocation_replay import AllocationReplay
from batchfit.policy.search.trial import Mode, Trial
from batchfit.policy.search.trial_cache import TrialCache
from batchfit.runtime.devices.allocator_settings import expandable_segments, set_allocator_settings
from batchfit.runtime.devices.caching_device import CachingCpuDevice, GarbageCollector
from batchfit.runtime.devices.cuda import CudaDevice, user_memory_fraction
from batchfit.runtime.devices.device import Device
from batchfit.runtime.devices.oom import is_out_of_memory
from batchfit.runtime.devices.resolve import cap_memory, parse_device, resolve_device
from batchfit.runtime.devices.tracker import resident_tensors
from batchfit.runtime.steps.finite import WHAT_TO_CHECK, LossLog
from batchfit.runtime.steps.reach import grad_scalers
from batchfit.runtime.steps.runner import TrialRunner
from batchfit.runtime.steps.state import TrainingSnapshot
from batchfit.runtime.workloads.examples import build_example
from batchfit.search.find_batch_size import find_on
from batchfit.search.starting_evidence import Known
from batchfit.where import ResolvedDevice

DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=pytest.mark.gpu)]
#: The devices with the CPU's stand-in for CUDA's caching allocator too.
CACHING_DEVICES = [DEVICES[0], pytest.param("cpu-caching", id="cpu-caching"), DEVICES[1]]
#: The stand-in for CUDA's caching allocator with expandable segments (``expandable_segments:True``).
EXPANDABLE = pytest.param("cpu-expandable", id="cpu-expandable")
#: Steps in a probe of the truth (a trial takes 2: the issue measured 2, 10 and 40 alike).
TRUTH_STEPS = 10


def target_for(device: str, limit: int | None) -> Device:
    """The device a test means: ``cpu-caching`` is the CPU with CUDA's caching allocator modelled."""
    if device in ("cpu-caching", "cpu-expandable"):
        return CachingCpuDevice(2**40 if limit is None else limit, device == "cpu-expandable")
    return resolve_device(device, limit)


def find(
    workload: Workload,
    mode: Mode,
    device: str,
    cap: int,
    *,
    memory_fraction: float = 0.8,
    max_batch_size: int | None = None,
) -> SearchResult:
    sizes = BatchSizes(max_batch_size=max_batch_size)
    if device in ("cpu-caching", "cpu-expandable"):
        return find_on(ResolvedDevice(target_for(device, cap), memory_fraction), workload, mode, sizes)
    return find_batch_size(
        workload, mode, device=device, memory_limit=cap, memory_fraction=memory_fraction, sizes=sizes
    )


def cnn_workload(device: str, *, amp: bool = False, loss_scale: float = 1.0) -> Workload:
    """A BatchNorm CNN on 3x32x32 images with SGD and momentum; with ``amp``, its step runs under
    autocast (fp16 on CUDA, bf16 on the CPU) with a GradScaler, as mixed-precision training does,
    its loss multiplied by ``loss_scale`` (in fp16, 1e3 overflows a fresh scaler's first steps).
    On the CPU with ``amp`` the images are 16x16, a quarter of the work: bf16 autocast there runs
    about 20x slower on a CPU without bfloat16 kernels, and the smaller step shows the same."""
    torch.manual_seed(0)
    target = target_for(device, None).torch_device
    side = 16 if amp and target.type == "cpu" else 32
    model = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.BatchNorm2d(64),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(64, 64, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(64, 10),
    ).to(target)

    def make_batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(n)
        inputs = torch.randn(n, 3, side, side, generator=generator)
        return inputs, torch.randint(0, 10, (n,), generator=generator)

    workload = Workload(
        model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        make_batch=make_batch,
        loss_fn=nn.functional.cross_entropy,
        name="gpu-test-cnn",
    )
    if amp:
        dtype = torch.float16 if target.type == "cuda" else torch.bfloat16
        scaler = torch.amp.GradScaler(target.type)

        def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, batch: Any) -> None:
            inputs, labels = batch
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast(target.type, dtype=dtype):
                loss = nn.functional.cross_entropy(model(inputs), labels) * loss_scale
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()

        workload.train_step = train_step
    return workload


def fresh(workload: Workload, weights: dict[str, torch.Tensor]) -> torch.optim.Optimizer:
    """The freshly built state: initial weights, no gradients, no optimizer state, nothing cached."""
    optimizer = workload.optimizer
    assert isinstance(optimizer, torch.optim.Optimizer)
    workload.model.load_state_dict(weights)
    for parameter in workload.model.parameters():
        parameter.grad = None
    optimizer.state.clear()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return optimizer


def fits(workload: Workload, mode: str, device: str, cap: int, batch_size: int) -> bool:
    """Whether TRUTH_STEPS steps of ``mode`` complete under a hard cap of ``cap`` bytes."""
    # The initial weights wait on the host: on CUDA the cap counts every tensor of the process.
    weights = {name: value.to("cpu", copy=True) for name, value in workload.model.state_dict().items()}
    optimizer = fresh(workload, weights)
    host = workload.host_batch(batch_size)
    capped = target_for(device, cap)
    target = capped.torch_device
    try:
        with capped.measure(resident_tensors(workload.model, optimizer), cap):
            if mode == "eval":  # validation inside training: gradients and optimizer state resident
                workload.model.train()
                workload.run_train_step(optimizer, [t.to(target) for t in workload.host_batch(1)])
            workload.model.train(mode == "train")
            for _ in range(TRUTH_STEPS):
                batch = [tensor.to(target, copy=True) for tensor in host]
                if mode == "train":
                    workload.run_train_step(optimizer, batch)
                else:
                    workload.run_eval_step(batch)
                del batch
            if target.type == "cuda":
                torch.cuda.synchronize(target)
        return True
    except Exception as error:  # cuDNN's "unable to find an engine" under the cap is one too
        if not is_out_of_memory(error):
            raise
        return False
    finally:
        fresh(workload, weights)
        workload.model.train()


def reference_cap(workload: Workload, device: str, batch_size: int) -> int:
    """A cap near what ``batch_size`` needs: its trial's reserved peak (caching), or its peak (CPU)."""
    target = target_for(device, None)
    snapshot = TrainingSnapshot.capture(workload.model, workload.optimizer, (workload.train_step,))  # type: ignore[arg-type]
    snapshot.set_gradients_aside()
    try:
        trial = TrialRunner.on(workload, target, "train", 2, 2**40, snapshot, None).run(batch_size)
    finally:
        snapshot.restore()
    assert trial.fits, trial
    return int(trial.reserved_peak_bytes or trial.peak_bytes)


def truth_near(workload: Workload, mode: str, device: str, cap: int, answer: int, upper: int) -> int:
    """The largest batch up to ``upper`` that fits, by force, from every size within 3 of
    ``answer``: those below the largest that fits must fit too (memory grows with the batch)."""
    window = range(max(1, answer - 3), min(upper, answer + 3) + 1)
    fitting = [b for b in window if fits(workload, mode, device, cap, b)]
    assert fitting == list(range(window.start, max(fitting) + 1)), fitting
    return max(fitting)


@pytest.fixture
def benchmark_on() -> Any:
    before = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = True
    yield
    torch.backends.cudnn.benchmark = before


@pytest.mark.parametrize("device", [*CACHING_DEVICES, EXPANDABLE])
@pytest.mark.parametrize(
    ("mode", "amp"), [("train", False), ("eval", False), pytest.param("train", True, id="train-amp")]
)
def test_the_answer_is_the_truth_under_the_cap(device: str, mode: str, amp: bool) -> None:
    workload = cnn_workload(device, amp=amp)
    cap = reference_cap(workload, device, 48)
    result = find(workload, mode, device, cap, memory_fraction=1.0)
    assert result.budget_bytes == cap
    # The step's GradScaler (amp) was never stepped: it is left so, no scale made, none faked.
    assert all(scaler._scale is None for scaler in grad_scalers(workload.train_step))
    truth = truth_near(workload, mode, device, cap, result.batch_size, result.max_batch_size)
    assert result.batch_size == truth
    assert result.answer.fits and result.answer.allocator_retries >= 0
    if device.startswith("cpu-"):  # the opening's requests, replayed, place the answer and the next
        band = result.band
        assert band is not None and band.high == truth and band.isolated is None
        # Then the check below the answer: at most the replay's closest call, which fits.
        checked = [t.batch_size for t in result.trials[4:]]
        assert [t.batch_size for t in result.trials[:4]] == [2, 4, truth, truth + 1]
        assert checked == list(band.confirmed_at) and len(checked) <= 1
        assert all(t.fits for t in result.trials[4:])
        # Each size up to the one after the answer replayed at most once on each of the pairs the
        # records made (2 and 4; then with the answer's): every size below a size asked is asked.
        assert 0 < result.replays <= 2 * (truth + 1)
        assert "placed by replaying the allocator's requests" in result.summary()


@pytest.mark.gpu
def test_on_cuda_an_amp_search_whose_first_steps_overflow_is_placed_by_the_replay() -> None:
    # A fresh GradScaler's first fp16 steps overflow (ResNet-50's did on an H200): the first trial
    # steps on until the optimizer steps, then runs again from the scale it reached, so that its
    # requests align with the later trials' and the replay places the answer.
    probe = cnn_workload("cuda", amp=True, loss_scale=1e3)
    (scaler,) = grad_scalers(probe.train_step)
    probe.run_train_step(probe.build_optimizer(), tuple(t.cuda() for t in probe.host_batch(2)))
    assert scaler.get_scale() < 65536.0  # it overflowed
    workload = cnn_workload("cuda", amp=True, loss_scale=1e3)
    cap = reference_cap(workload, "cuda", 48)
    result = find(workload, "train", "cuda", cap, memory_fraction=1.0)
    assert result.replays > 0 and result.trials[0].steps == 2
    truth = truth_near(workload, "train", "cuda", cap, result.batch_size, result.max_batch_size)
    assert result.batch_size == truth


EXPANDABLE_ON_CUDA = """
import json, sys
import torch
sys.path.insert(0, "tests")
import test_gpu
workload = test_gpu.cnn_workload("cuda")
cap = test_gpu.reference_cap(workload, "cuda", 48)
result = test_gpu.find(workload, "train", "cuda", cap, memory_fraction=1.0)
truth = test_gpu.truth_near(workload, "train", "cuda", cap, result.batch_size, result.max_batch_size)
segments = torch.cuda.memory_snapshot()
print(json.dumps({
    "answer": result.batch_size, "truth": truth, "replays": result.replays,
    "sizes": [trial.batch_size for trial in result.trials],
    "expandable": bool(segments) and all(segment.get("is_expandable") for segment in segments),
}))
"""


@pytest.mark.gpu
def test_on_cuda_with_expandable_segments_the_replay_places_the_truth() -> None:
    # A process whose allocator makes expandable segments, as PYTORCH_CUDA_ALLOC_CONF sets it
    # (torchtitan's default; PyTorch's out-of-memory message suggests it): the records say so and
    # the replay models that allocator (the CPU's stand-in: the cpu-expandable case above).
    env = {key: value for key, value in os.environ.items() if "ALLOC_CONF" not in key}
    env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run(
        [sys.executable, "-c", EXPANDABLE_ON_CUDA],
        capture_output=True,
        text=True,
        env=env,
        cwd=root,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.splitlines()[-1])
    print(found)  # the trials, for the record of a GPU run
    assert found["expandable"] and found["answer"] == found["truth"] and found["replays"] > 0, found


@pytest.mark.gpu
def test_on_cuda_compare_measures_expandable_segments_and_puts_the_setting_back() -> None:
    # The row's search runs with new segments expandable (the workload's own stay as made); its
    # answer is the truth by force with the setting made the same way, and the setting is back after.
    workload = cnn_workload("cuda")
    cap = reference_cap(workload, "cuda", 48)
    comparison = batchfit.compare(
        workload,
        ["expandable-segments"],
        device="cuda",
        memory_limit=cap,
        memory_fraction=1.0,
        timing=Timing(time_budget_seconds=0),
    )
    baseline, row = comparison.rows
    assert row.applied and "expandable_segments:True" in row.note and row.batch_size is not None
    assert not expandable_segments()
    set_allocator_settings("expandable_segments:True")
    try:
        truth = truth_near(workload, "train", "cuda", cap, row.batch_size, 4096)
    finally:
        set_allocator_settings("expandable_segments:False")
    print({"baseline": baseline.batch_size, "expandable": row.batch_size, "truth": truth})  # for the record
    assert row.batch_size == truth


@pytest.mark.parametrize("device", CACHING_DEVICES)
def test_a_discriminator_and_an_ema_the_step_updates_are_put_back_on_every_device(device: str) -> None:
    # Their tensors are resident in every trial (the modelled allocator holds them too), and they
    # come back bit for bit: the state a GAN's or an EMA's training step keeps beside the model.
    workload, other = adversarial(device="cuda" if device == "cuda" else "cpu")
    critic, critic_optimizer, ema = other["critic"], other["critic_optimizer"], other["ema"]
    # On CUDA, a budget 8 MiB above what batch 1 holds: cuBLAS's workspaces alone take about 64 MiB
    # (H200). The budget is 0.8 of the cap.
    cap = 8 * 2**20 if device != "cuda" else int((8 * 2**20 + reference_cap(workload, device, 1)) / 0.8)
    before = _same_state(critic, ema)
    result = find(workload, "train", device, cap, max_batch_size=4096)
    assert result.batch_size > 2 and not result.predicted_trials
    assert _same_state(critic, ema) == before and len(critic_optimizer.state) == 0
    weight = critic[0].weight.detach().clone()
    workload.run_train_step(workload.build_optimizer(), [t.to(weight.device) for t in workload.host_batch(8)])
    assert not torch.equal(critic[0].weight, weight)  # it trains after the search, as before it


def _same_state(*modules: nn.Module) -> list[tuple[str, bytes]]:
    """Every tensor of ``modules`` as bytes on the host (a fake tensor has none: it would raise)."""
    return [
        (name, value.detach().cpu().numpy().tobytes())
        for module in modules
        for name, value in module.state_dict().items()
    ]


@pytest.mark.gpu
def test_a_compiled_model_s_answer_is_the_truth_on_cuda() -> None:
    # CUDA's caching allocator serves Inductor's kernels as any other: no profiler, the cap as
    # for an eager step. Each trial's batch size runs the dynamic-shape graph after the opening.
    torch.manual_seed(0)
    model = pointwise_model().to("cuda")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loss = nn.functional.cross_entropy
    workload = Workload(torch.compile(model), optimizer, make_batch=pointwise_batch, loss_fn=loss)
    assert workload.compiled
    cap = reference_cap(workload, "cuda", 1024)
    result = find(workload, "train", "cuda", cap, memory_fraction=1.0, max_batch_size=8192)
    assert result.batch_size == truth_near(workload, "train", "cuda", cap, result.batch_size, 8192)


@pytest.mark.gpu
def test_a_batch_made_on_the_gpu_counts_once() -> None:
    # A make_batch that makes its tensors on the GPU (synthetic data often is) had its batch kept
    # there, outside the step, beside each step's copy: it counted twice against the cap. Here
    # the images are most of the step's memory, so that would halve the answer.
    def pooled(on: str) -> Workload:
        torch.manual_seed(0)
        model = nn.Sequential(nn.AvgPool2d(8), nn.Flatten(), nn.Linear(3 * 8 * 8, 10)).cuda()

        def make_batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
            return torch.randn(n, 3, 64, 64, device=on), torch.randint(0, 10, (n,), device=on)

        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        return Workload(model, optimizer, make_batch=make_batch, loss_fn=nn.functional.cross_entropy)

    # 64 MiB above what batch 1 holds: cuBLAS's workspaces alone take about 64 MiB (H200).
    cap = 64 * 2**20 + reference_cap(pooled("cpu"), "cuda", 1)
    answers = [
        find(pooled(on), "train", "cuda", cap, max_batch_size=4096).batch_size for on in ("cpu", "cuda")
    ]
    assert answers[0] > 100 and abs(answers[1] - answers[0]) <= answers[0] // 50  # not about half
    assert all(tensor.device.type == "cpu" for tensor in pooled("cuda").host_batch(4))


@pytest.mark.parametrize("device", CACHING_DEVICES[1:])
@pytest.mark.parametrize(
    ("mode", "amp"), [("train", False), ("eval", False), pytest.param("train", True, id="train-amp")]
)
def test_the_opening_trials_record_requests_that_replay_at_other_sizes(
    device: str, mode: str, amp: bool
) -> None:
    # What find's forecast needs of a device: the trials at 2 and 4 record the allocator's requests
    # step by step, so that they align request for request (the first trial's requests made once,
    # such as the GradScaler's scale, left out) and the last step can be played again. On CUDA the
    # records come from torch's allocator history.
    workload = cnn_workload(device, amp=amp)
    cap = reference_cap(workload, device, 48)
    target = target_for(device, cap)
    snapshot = TrainingSnapshot.capture(workload.model, workload.optimizer, (workload.train_step,))  # type: ignore[arg-type]
    snapshot.set_gradients_aside()
    warm = 1 if mode == "eval" else None
    runner = TrialRunner.on(workload, target, mode, 2, cap, snapshot, warm, record=True)  # type: ignore[arg-type]
    try:
        trials = [runner.run(2), runner.run(4)]
    finally:
        snapshot.restore()
    assert all(t.fits for t in trials) and sorted(runner.records) == [2, 4]
    replay = AllocationReplay.of(runner.records[2], runner.records[4])
    assert replay is not None and replay.repeatable
    assert replay.fits(4, cap, 2) is True and replay.fits(4096, cap, 2) is False


@pytest.mark.gpu
def test_cudnn_benchmark_does_not_lower_the_answer(benchmark_on: None) -> None:
    # cuDNN tries algorithms with large workspaces on the first step at a shape; under the cap it
    # skips those that do not fit, so the first step's spike does not decide.
    workload = cnn_workload("cuda")
    cap = reference_cap(workload, "cuda", 48)
    result = find_batch_size(workload, device="cuda", memory_limit=cap, memory_fraction=1.0)
    truth = truth_near(workload, "train", "cuda", cap, result.batch_size, result.max_batch_size)
    assert result.batch_size == truth


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["train", "eval"])
def test_a_confirming_trial_ends_where_the_allocator_state_recurs_with_the_verdict_of_30(mode: str) -> None:
    # On CUDA the state is torch.cuda.memory_snapshot()'s segments and blocks. (The CPU checks the
    # same on the modelled allocator in tests/runtime/steps/test_steps.py, with a smaller model.)
    workload = cnn_workload("cuda")
    cap = reference_cap(workload, "cuda", 48)
    target = target_for("cuda", cap)
    snapshot = TrainingSnapshot.capture(workload.model, workload.optimizer, (workload.train_step,))  # type: ignore[arg-type]
    snapshot.set_gradients_aside()
    warm = 1 if mode == "eval" else None

    def runner(steps: int, until_steady: bool) -> TrialRunner:
        return TrialRunner.on(workload, target, mode, steps, cap, snapshot, warm, until_steady=until_steady)  # type: ignore[arg-type]

    sizes = list(range(40, 58, 2))
    try:
        early = [runner(10, True).run(size) for size in sizes]
        full = [runner(30, False).run(size) for size in sizes]
    finally:
        snapshot.restore()
    assert [t.fits for t in early] == [t.fits for t in full], (early, full)
    assert any(t.fits and t.steps is not None and t.steps < 10 for t in early), early


@pytest.mark.parametrize("device", CACHING_DEVICES)
def test_a_smaller_trial_after_a_larger_one_reads_its_own_peak(device: str) -> None:
    workload = cnn_workload(device)
    target = target_for(device, None)
    snapshot = TrainingSnapshot.capture(workload.model, workload.optimizer, (workload.train_step,))  # type: ignore[arg-type]
    snapshot.set_gradients_aside()
    runner = TrialRunner.on(workload, target, "train", 2, 2**40, snapshot, None)
    try:
        alone, large, again = runner.run(8), runner.run(256), runner.run(8)
    finally:
        snapshot.restore()
    assert again.peak_bytes == alone.peak_bytes < large.peak_bytes
    if device != "cpu":  # what the caching allocator held is the small batch's own
        assert alone.reserved_peak_bytes is not None and again.reserved_peak_bytes is not None
        assert again.reserved_peak_bytes <= alone.reserved_peak_bytes + 2 * 2**20
        assert large.reserved_peak_bytes is not None and again.reserved_peak_bytes < large.reserved_peak_bytes


@pytest.mark.parametrize("device", CACHING_DEVICES)
def test_a_trial_does_not_keep_what_it_started_with_alive(device: str) -> None:
    # A step may replace a tensor it started with (L-BFGS's history, a buffer assigned anew):
    # training frees the old one, so the measuring block must not hold it.
    # (Against the same block where the old one is kept: on CUDA the allocator's peak counts
    # whatever else the process holds.)
    target = target_for(device, 64 * 2**20)
    peaks = []
    for keep in (True, False):
        old = torch.empty(2**18, device=target.torch_device)  # 1 MiB
        replaced = weakref.ref(old)
        with target.measure([old], 64 * 2**20) as measurement:
            kept = [old] if keep else []
            del old
            assert (replaced() is None) != keep
            new = torch.empty(2**18, device=target.torch_device)
        peaks.append(measurement.peak_bytes)
        del kept, new
    assert peaks[0] - peaks[1] == 2**20


@pytest.mark.parametrize("device", CACHING_DEVICES[1:])
def test_a_failed_trial_names_the_step_that_ran_out(device: str) -> None:
    # Adam's state, made at the 9th step, is what does not fit under the cap that the same
    # workload reserved without it: the trial runs 8 steps and says it ran out at the 9th (on the
    # H100 a small CNN fit 2 steps at 50 and 53 and failed within 10: this is where it shows).
    on = target_for(device, None).torch_device

    def trial(skipped: int, cap: int) -> Trial:
        workload = skipping_workload(skipped, on)
        snapshot = TrainingSnapshot.capture(workload.model, None)
        runner = TrialRunner.on(workload, target_for(device, cap), "train", 10, cap, snapshot, None)
        try:
            return runner.run(16)
        finally:
            snapshot.restore()

    without_state = trial(100, 2**40)
    assert without_state.fits and without_state.reserved_peak_bytes is not None
    cap = without_state.reserved_peak_bytes
    late, never = trial(8, cap), trial(100, cap)
    assert late.outcome == "oom" and (late.failed_at_step, late.steps) == (9, 10), late
    assert never.fits and never.failed_at_step is None, never


def _state(workload: Workload) -> dict[str, Any]:
    optimizer = workload.optimizer
    assert isinstance(optimizer, torch.optim.Optimizer)
    state: dict[str, Any] = {
        "model": {key: value.clone() for key, value in workload.model.state_dict().items()},
        "grads": [None if p.grad is None else p.grad.clone() for p in workload.model.parameters()],
        "optimizer": [
            {key: value.clone() if isinstance(value, torch.Tensor) else value for key, value in s.items()}
            for s in optimizer.state.values()
        ],
        "training": [module.training for module in workload.model.modules()],
        "cpu_rng": torch.get_rng_state(),
        "python_rng": random.getstate(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda_rng"] = torch.cuda.get_rng_state_all()
    for scaler in grad_scalers(workload.train_step):
        state.setdefault("scalers", []).append(
            [None if value is None else value.clone() for value in (scaler._scale, scaler._growth_tracker)]
        )
    return state


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.device == b.device and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(map(_same, a, b))
    return bool(a == b)


@pytest.mark.parametrize("device", CACHING_DEVICES)
@pytest.mark.parametrize("amp", [False, pytest.param(True, id="amp")])
def test_everything_is_put_back_bit_for_bit(device: str, amp: bool) -> None:
    workload = cnn_workload(device, amp=amp)  # with amp, the GradScaler's scale and tracker too
    optimizer = workload.optimizer
    assert isinstance(optimizer, torch.optim.Optimizer)
    for n in (4, 6):  # mid-training: momentum buffers, BatchNorm statistics, gradients
        optimizer.zero_grad()
        workload.run_train_step(
            optimizer, [t.to(target_for(device, None).torch_device) for t in workload.host_batch(n)]
        )
    torch.rand(3, device=target_for(device, None).torch_device)  # the device's RNG has moved
    before = _state(workload)
    cap = reference_cap(workload, device, 32)
    for mode in ("train", "eval"):
        find(workload, mode, device, cap)
    assert _same(before, _state(workload))


class Boom(Exception):
    pass


def _cap_in_force(target: Device) -> float | None:
    """The CUDA fraction in force, or on the CPU whether a tracker is still intercepting and the
    modelled allocator still capped (1.0: neither)."""
    if target.torch_device.type == "cuda":
        return user_memory_fraction(torch.cuda.current_device())
    capped = isinstance(target, CachingCpuDevice) and target.allocator.model.limit_bytes is not None  # type: ignore[attr-defined]
    return 1.0 if _get_current_dispatch_mode() is None and not capped else None


@pytest.mark.parametrize("device", CACHING_DEVICES)
@pytest.mark.parametrize("ending", ["success", "error", "interrupt"])
def test_the_user_s_cap_is_put_back(device: str, ending: str) -> None:
    workload = cnn_workload(device)
    cap = reference_cap(workload, device, 32)
    user_fraction = 0.9
    if device == "cuda":
        torch.cuda.set_per_process_memory_fraction(user_fraction)
    calls: list[int] = []
    error: BaseException = Boom("a bug in the step") if ending == "error" else KeyboardInterrupt()

    def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, batch: Any) -> None:
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(batch[0]), batch[1]).backward()
        optimizer.step()
        if not isinstance(batch[0], FakeTensor):  # a real step, not the CPU's forecast
            calls.append(len(batch[0]))
            if ending != "success" and len(calls) == 2:  # the first trial's second step
                raise error

    workload.train_step = train_step
    target = target_for(device, cap)
    try:
        if ending == "success":
            find_on(ResolvedDevice(target, 0.8), workload, "train")
        else:
            with pytest.raises(type(error)):
                find_on(ResolvedDevice(target, 0.8), workload, "train")
        # The allocator keeps the fraction as bytes of the device's total: it reads back to ~1e-11.
        assert _cap_in_force(target) == pytest.approx(user_fraction if device == "cuda" else 1.0, abs=1e-9)
    finally:
        if device == "cuda":
            torch.cuda.set_per_process_memory_fraction(1.0)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "args",
    [
        pytest.param(("--example", "transformer", "--memory-limit", "2GiB"), id="readme-default-device"),
        pytest.param(("--example", "cnn", "--device", "cuda", "--memory-limit", "1GiB"), id="cuda"),
    ],
)
def test_the_cli_runs_on_cuda(args: tuple[str, ...], tmp_path: Any) -> None:
    # The README's main command finds the GPU by default, and the built-in example is built there.
    results = _cli(["find", *args, "--modes", "train,eval"], tmp_path)["results"]
    assert [result["mode"] for result in results] == ["train", "eval"]
    for result in results:
        assert result["device"].startswith("cuda:") and "(capped at " in result["device"]
        assert result["batch_size"] >= 1 and result["stop_reason"] in ("boundary", "max_batch_size")


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("args", "device_of"),
    [
        pytest.param(
            ("explore", "--example", "mlp", "--max-batch-size", "256", "--time-budget-seconds", "5"),
            lambda document: document["device"],
            id="explore",
        ),
        pytest.param(
            (
                "compare",
                "--example",
                "cnn",
                "--techniques",
                "amp,cudnn-benchmark-on",
                "--time-budget-seconds",
                "0",
            ),
            lambda document: document["device"],
            id="compare",
        ),
        pytest.param(
            ("advise", "--example", "mlp", "--skip", "explore,compare"),
            lambda document: document["train"]["device"],
            id="advise",
        ),
        pytest.param(
            (
                "check-data",
                "--workload",
                "data_workloads:fast",
                "--batch-size",
                "64",
                "--time-budget-seconds",
                "10",
            ),
            lambda document: document["device"],
            id="check-data",
        ),
    ],
)
def test_every_command_runs_on_the_gpu_it_is_given(
    args: tuple[str, ...], device_of: Any, tmp_path: Any
) -> None:
    # Each command builds its example (or calls a workload function with the device) on cuda and
    # measures there; find's own test is above. (check-data caps nothing: --memory-limit is not its.)
    cap = () if args[0] == "check-data" else ("--memory-limit", "1GiB")
    (document,) = _cli([*args, "--device", "cuda", *cap], tmp_path)["results"]
    print(args[0], json.dumps(document)[:2000])  # the figures, for the record of a GPU run
    assert device_of(document).startswith("cuda"), document
    if args[0] == "compare":
        rows = {row["technique"]: row for row in document["rows"]}
        assert list(rows) == ["baseline", "amp", "cudnn-benchmark-on"]
        assert all(row["batch_size"] for row in rows.values()), rows


@pytest.mark.gpu
def test_analyze_runs_on_the_gpu_its_config_names(tmp_path: Any) -> None:
    # An experiment config's DEVICE reaches the searches: on cuda, the built-in mlp under 1 GiB.
    (tmp_path / "exp.yaml").write_text(
        "WORKLOAD: example:mlp\nDEVICE: cuda\nMEMORY_LIMIT: 1GiB\n"
        "DATA:\n  BATCH_SIZE: 32\n  BATCH_SIZE_VAL: 64\n"
    )
    _cli(
        ["analyze", "--cfg", "exp.yaml", "--fractions", "0.8", "--modes", "train", "--output", "out.json"],
        tmp_path,
        json_out=False,
    )
    (document,) = json.loads((tmp_path / "out.json").read_text())["results"]
    assert document["device"].startswith("cuda") and document["rows"][0]["batch_size"] >= 1, document


def _cli(args: list[str], cwd: Any, json_out: bool = True) -> Any:
    """``python -m batchfit ARGS`` in ``cwd`` (tests/ importable, for its workload modules): its JSON
    result from stdout, or None with ``json_out=False``; the command must succeed."""
    env = {key: value for key, value in os.environ.items() if key != "BATCHFIT_DEBUG"}
    tests = os.path.dirname(os.path.abspath(__file__))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [tests, env.get("PYTHONPATH")]))
    command = [sys.executable, "-m", "batchfit", *args, *(["--format", "json"] if json_out else [])]
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=cwd, timeout=600)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout) if json_out else None


def test_cap_memory_lifts_its_cap_on_every_device() -> None:
    # The standalone cap on the CPU: nothing intercepts after the block, however it ends.
    with pytest.raises(torch.OutOfMemoryError), cap_memory("1MiB"):
        torch.empty(2**20)
    assert _get_current_dispatch_mode() is None
    assert batchfit.cap_memory is cap_memory


#: MicroBatchStep's test: (hidden width, batch) per device: activations far above the weights and, on
#: CUDA, half the micro-batch's activations far above the caching allocator's rounding.
MICRO_BATCH_SIZES = {"cpu": (256, 2048), "cuda": (1024, 32768)}


@pytest.mark.parametrize("device", DEVICES)
def test_micro_batch_step_survives_an_out_of_memory_under_the_cap(device: str) -> None:
    # The cap lies halfway between the peaks of the whole batch in one micro-batch and in two, both
    # measured: the first call runs out of memory, halves, and steps as one unbroken step would.
    # The allocated peaks: on CUDA what a step reserves with no cap holds cached blocks that a
    # capped allocator frees and retries without (on the H100 the whole batch fitted halfway
    # between the two reserved peaks).
    width, samples = MICRO_BATCH_SIZES[device]
    target = parse_device(device)

    def fresh() -> tuple[nn.Module, torch.optim.Optimizer]:
        torch.manual_seed(0)
        model = nn.Sequential(
            nn.Linear(256, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10)
        )
        model = model.to(target)
        return model, torch.optim.SGD(model.parameters(), lr=0.1)

    generator = torch.Generator().manual_seed(0)
    batch = (
        torch.randn(samples, 256, generator=generator).to(target),
        torch.randint(0, 10, (samples,), generator=generator).to(target),
    )

    def peak(micro_batch_size: int) -> int:
        model, optimizer = fresh()
        step = batchfit.MicroBatchStep(
            model, optimizer, loss_fn=nn.functional.cross_entropy, micro_batch_size=micro_batch_size
        )
        with cap_memory(
            "64GiB" if device == "cpu" else torch.cuda.mem_get_info(target)[1],
            resident=[model, optimizer, *batch],
            device=device,
        ) as measured:
            step(batch)
        del model, optimizer, step
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()
        return measured.peak_bytes

    whole, halves = peak(samples), peak(samples // 2)
    assert whole > halves * 1.2, (whole, halves)  # the activations make the difference
    reference, reference_optimizer = fresh()
    expected = torch.nn.functional.cross_entropy(reference(batch[0]), batch[1])
    expected.backward()
    reference_optimizer.step()

    model, optimizer = fresh()
    step = batchfit.MicroBatchStep(
        model, optimizer, loss_fn=nn.functional.cross_entropy, micro_batch_size=samples
    )
    with cap_memory((whole + halves) // 2, resident=[model, optimizer, *batch], device=device):
        loss = step(batch)
    assert step.micro_batch_size == samples // 2
    reasons = [change.reason for change in step.history]
    assert reasons in (["out of memory in backward"], ["out of memory in forward"])
    torch.testing.assert_close(loss, expected.detach(), rtol=1e-5, atol=1e-6)
    for got, want in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_building_an_example_leaves_every_rng_as_it_was(device: str) -> None:
    # The weights are drawn on the host: neither the CPU generator nor a CUDA one is moved.
    cpu = torch.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []
    first = build_example("mlp", device)
    assert torch.equal(cpu, torch.get_rng_state())
    if torch.cuda.is_available():
        after = torch.cuda.get_rng_state_all()
        assert len(after) == len(cuda) and all(torch.equal(a, b) for a, b in zip(cuda, after, strict=True))
    second = build_example("mlp", "cpu")
    for a, b in zip(first.model.parameters(), second.model.parameters(), strict=True):
        assert torch.equal(a.cpu(), b)  # the same weights on every device


@pytest.mark.gpu
def test_the_user_s_memory_fraction_bounds_the_capacity() -> None:
    # Training runs under the fraction the user set for the process, so the budget is within it.
    index = torch.cuda.current_device()
    before = user_memory_fraction(index)
    torch.cuda.set_per_process_memory_fraction(0.25, index)
    try:
        total = torch.cuda.mem_get_info(index)[1]
        assert resolve_device("cuda", None).capacity_bytes([]) <= int(0.25 * total)
        workload = cnn_workload("cuda")
        result = find_batch_size(
            workload, device="cuda", memory_fraction=0.8, sizes=BatchSizes(max_batch_size=8)
        )
        assert result.capacity_bytes <= int(0.25 * total)
        assert user_memory_fraction(index) == 0.25  # put back after the search's own caps
    finally:
        torch.cuda.set_per_process_memory_fraction(before, index)


class _Cycle:
    """An object in a reference cycle with itself, holding a tensor: only the collector frees it."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor, self.me = tensor, self


def _release_on(device: str) -> tuple[GarbageCollector, Any, list[weakref.ref[torch.Tensor]]]:
    """The device's collector and release(); on the CPU (no allocator to read) a collector of the
    bytes held by the tensors this test makes, weakly referenced."""
    made: list[weakref.ref[torch.Tensor]] = []
    if device == "cuda":
        target = resolve_device("cuda", None)
        assert isinstance(target, CudaDevice)
        return target.garbage, target.release, made

    def held() -> int:
        return sum(t.nbytes for ref in made if (t := ref()) is not None)

    collector = GarbageCollector(held)
    return collector, collector.collect, made


@pytest.mark.parametrize("device", DEVICES)
def test_release_walks_the_whole_heap_only_for_garbage_a_young_collection_missed(device: str) -> None:
    collector, release, made = _release_on(device)
    generations: list[int] = []

    def seen(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            generations.append(info["generation"])

    gc.disable()  # no automatic collection may move or free the test's garbage
    gc.callbacks.append(seen)
    try:
        release()  # the first: the caller's garbage too, the whole heap
        assert 2 in generations and collector.full_collections == 1
        # A trial's garbage: young. Freed by the younger generations alone.
        young = torch.ones(1 << 20, device=device)
        made.append(weakref.ref(young))
        _Cycle(young)
        del young
        generations.clear()
        release()
        assert made[-1]() is None and 2 not in generations and collector.full_collections == 1
        # Garbage that outlived a full collection sits in the oldest generation: the device still
        # holds it after the young collection, so the whole heap is walked, and it is freed.
        old = torch.ones(1 << 20, device=device)
        made.append(weakref.ref(old))
        cycle = _Cycle(old)
        del old
        gc.collect()  # survives (still referenced): promoted to the oldest generation
        del cycle
        generations.clear()
        release()
        assert made[-1]() is None and 2 in generations and collector.full_collections == 2
    finally:
        gc.callbacks.remove(seen)
        gc.enable()


@pytest.mark.gpu
def test_the_opening_s_recording_leaves_the_user_s_own_allocator_history_alone() -> None:
    # find records the opening's requests through torch's allocator history, and turns it off
    # after (which clears it); a user who records their own keeps it, and find does not replay.
    workload = cnn_workload("cuda")
    cap = reference_cap(workload, "cuda", 48)
    result = find_batch_size(workload, device="cuda", memory_limit=cap, memory_fraction=1.0)
    assert result.replays > 0 and not torch._C._cuda_isHistoryEnabled()
    torch.cuda.memory._record_memory_history(max_entries=100_000)
    try:
        torch.ones(1024, device="cuda")
        before = len(torch.cuda.memory._snapshot()["device_traces"][0])
        again = find_batch_size(workload, device="cuda", memory_limit=cap, memory_fraction=1.0)
        assert torch._C._cuda_isHistoryEnabled()
        assert len(torch.cuda.memory._snapshot()["device_traces"][0]) > before
        assert again.replays == 0 and again.answer.fits
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)


def test_a_search_at_another_fraction_replays_the_requests_its_cached_opening_recorded() -> None:
    # analyze's fractions share one TrialCache: the second search's opening comes from it (no
    # trial runs, so nothing is recorded), and the records the first search left place its trials
    # (the opening's, and its answer's, whose confirming trial fitted).
    workload = cnn_workload("cpu-caching")
    cap = reference_cap(workload, "cpu-caching", 48)
    cache = TrialCache()
    first = find_on(ResolvedDevice(CachingCpuDevice(cap), 1.0), workload, "train", known=Known(cache))
    second = find_on(ResolvedDevice(CachingCpuDevice(cap), 0.8), workload, "train", known=Known(cache))
    fitted = {t.batch_size for t in (*first.trials, *second.trials) if t.fits}
    assert sorted(cache.records) == sorted(fitted) and {2, 4, first.batch_size} <= fitted
    assert first.replays > 0 and second.replays > 0
    assert [t.reused for t in second.trials[:2]] == [True, True]
    truth = truth_near(workload, "train", "cpu-caching", second.budget_bytes, second.batch_size, 512)
    assert [t.batch_size for t in second.trials] == [2, 4, truth, truth + 1]


# -- steps that do not train, on CUDA: the losses kept on the device, read once a trial -------------


@pytest.mark.gpu
def test_on_cuda_the_losses_are_kept_without_waiting_for_the_device() -> None:
    log = LossLog(torch.device("cuda"), 4)
    loss = torch.ones((), device="cuda", requires_grad=True) * 2
    torch.cuda.set_sync_debug_mode("error")  # an operation that waits for the device raises
    try:
        for step, value in ((1, loss), (2, loss * math.inf), (3, loss.half())):
            log.step = step
            log.record(value)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert log.first_non_finite() == (2, math.inf)


@pytest.mark.gpu
def test_on_cuda_a_loss_that_turns_nan_stops_the_search_at_its_step() -> None:
    workload = build_example("mlp", "cuda")
    calls = []

    def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        loss = nn.functional.cross_entropy(output, target)
        return loss * math.nan if len(calls) == 2 else loss  # the second step's loss: NaN

    workload.loss_fn = loss_fn
    sizes = BatchSizes(min_batch_size=8, max_batch_size=8)
    with pytest.raises(NonFiniteError) as info:
        find_batch_size(workload, device="cuda", memory_limit="1GiB", sizes=sizes)
    assert str(info.value) == (
        "the train step's loss is nan at batch_size=8, step 2 of 2; batchfit does not answer from steps "
        f"that do not train. {WHAT_TO_CHECK}"
    )

"""torch.compile'd steps on the CPU devices: found in the workload, and measured as they run.

Dynamo runs a frame eagerly under a TorchDispatchMode, so the storage tracker measured a compiled
step as its eager twin. The truth here is read from the allocator's own running total, which the
profiler reports with each event, independently of batchfit's accounting by address.
"""

from __future__ import annotations

import pytest
import torch
from compiled_workloads import compiled_truth, make_batch, pointwise_model
from torch import nn

import batchfit
from batchfit import BatchSizes
from batchfit.errors import ConfigurationError
from batchfit.runtime.devices.caching_device import CachingCpuDevice
from batchfit.runtime.devices.device import CappedCpuDevice
from batchfit.runtime.devices.measurement import Measurement
from batchfit.runtime.devices.tracker import resident_tensors
from batchfit.runtime.steps.compiled import compiled_parts
from batchfit.runtime.steps.stepping import _optimizer_phases
from batchfit.runtime.steps.techniques import compiler_unavailable
from batchfit.search.find_batch_size import find_on
from batchfit.where import ResolvedDevice

LIMIT = 64 * 2**20
BUDGET = int(0.8 * LIMIT)


def test_a_compiled_model_is_measured_as_it_runs_not_as_its_eager_twin() -> None:
    if reason := compiler_unavailable("cpu"):
        pytest.skip(reason)
    torch.manual_seed(0)
    model = pointwise_model()
    compiled = torch.compile(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    before = {name: value.clone() for name, value in model.state_dict().items()}

    def find(module: nn.Module) -> batchfit.SearchResult:
        loss = nn.functional.cross_entropy
        workload = batchfit.Workload(module, optimizer, make_batch=make_batch, loss_fn=loss)
        return batchfit.find_batch_size(
            workload, device="cpu", memory_limit=LIMIT, sizes=BatchSizes(max_batch_size=8192)
        )

    eager = find(model)
    found = find(compiled)
    assert not found.predicted_trials  # a trace would size the eager twin: real trials only
    assert found.compiled == ("OptimizedModule (the model)",) and eager.compiled == ()
    assert "runs torch.compile'd code (OptimizedModule (the model)), measured as it runs" in found.summary()
    answer = found.batch_size
    truth = compiled_truth([answer, answer + 1])
    assert truth[answer] <= BUDGET < truth[answer + 1], (answer, truth, BUDGET)
    assert found.peak_bytes == truth[answer]  # to the byte, by the allocator's own total
    # The tracker sized the eager step: 778 here, where the compiled step fits 3x as many.
    assert answer > 2 * eager.batch_size, (answer, eager.batch_size)
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), name


def test_a_model_compiled_for_each_batch_size_is_compiled_at_every_trial() -> None:
    # dynamic=False compiles a graph per batch size, and past Dynamo's recompile limit a frame
    # runs eagerly: with the limit at 2, the old search measured the eager step from its third
    # size on. The search now has room for its sizes, and the user's limit is put back after.
    if reason := compiler_unavailable("cpu"):
        pytest.skip(reason)
    from torch._dynamo import config

    torch.manual_seed(0)
    model = pointwise_model(blocks=1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loss = nn.functional.cross_entropy
    workload = batchfit.Workload(
        torch.compile(model, dynamic=False), optimizer, make_batch=make_batch, loss_fn=loss
    )
    with config.patch(cache_size_limit=2):  # multiples of 32: fewer sizes, each compiled cold in ~3 s
        found = batchfit.find_batch_size(
            workload,
            device="cpu",
            memory_limit="24MiB",
            sizes=BatchSizes(max_batch_size=8192, multiple_of=32),
        )
        assert config.cache_size_limit == 2
    answer = found.batch_size
    truth = compiled_truth([answer, answer + 32], static_blocks=1)
    assert truth[answer] <= found.budget_bytes < truth[answer + 32], (answer, truth, found.budget_bytes)
    assert len({trial.batch_size for trial in found.trials}) > 2  # past the limit the user had set


def test_compiled_parts_finds_what_runs_compiled_code() -> None:
    model = nn.Linear(4, 4)
    assert compiled_parts(model, None) == []
    assert compiled_parts(torch.compile(model)) == ["OptimizedModule (the model)"]

    inner = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    inner[0].compile()  # nn.Module.compile(): the module compiles itself in place
    assert compiled_parts(inner) == ["Linear 0"]

    forward_compiled = nn.Linear(4, 4)
    forward_compiled.forward = torch.compile(forward_compiled.forward)  # type: ignore[method-assign]
    assert compiled_parts(forward_compiled) == ["Linear (the model)"]

    compiled_model = torch.compile(nn.Linear(4, 4))

    def step(model: nn.Module, optimizer: torch.optim.Optimizer, batch: torch.Tensor) -> None:
        compiled_model(batch).sum().backward()  # the step calls a compiled model it closes over

    assert compiled_parts(nn.Linear(4, 4), step) == ["OptimizedModule (the model)"]

    @torch.compile
    def loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return (output - target).pow(2).mean()

    assert compiled_parts(model, None, None, loss) == [f"function {loss.__qualname__}"]
    assert batchfit.Workload(model, make_batch=make_batch, loss_fn=loss).compiled == (
        f"function {loss.__qualname__}",
    )


def test_the_modelled_caching_allocator_refuses_a_compiled_step_and_says_what_to_use() -> None:
    model = nn.Linear(8, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    workload = batchfit.Workload(torch.compile(model), optimizer, make_batch=lambda n: torch.randn(n, 8))
    with pytest.raises(ConfigurationError, match=r"cannot measure a torch.compile'd step \(OptimizedModule"):
        find_on(
            ResolvedDevice(CachingCpuDevice(2**30), 0.8),
            workload,
            "train",
            sizes=BatchSizes(max_batch_size=64),
        )


def test_profiled_measurement_counts_what_the_block_allocates_and_refuses_past_the_cap() -> None:
    # The profiled path on eager ops, against the storage tracker on the same block: equal peaks,
    # and a cap between them fails the trial at the step that crossed it, the message the tracker's.
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 4))
    # Momentum SGD: Adam's scalar step counts are made where the dispatch mode does not see them.
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def steps(device: CappedCpuDevice, compiled: bool, cap: int | None) -> Measurement:
        torch.manual_seed(0)
        with (
            device.measure(list(resident_tensors(model, optimizer)), cap, compiled=compiled) as measurement,
            _optimizer_phases(measurement),
        ):
            for _ in range(2):
                measurement.begin_step()
                measurement.steps += 1
                model(torch.randn(512, 64)).sum().backward()
                optimizer.step()
                optimizer.zero_grad()
        return measurement

    device = CappedCpuDevice(2**30)
    steps(device, False, None)  # the momentum made, as in a trial's first step
    tracked = steps(device, False, None)
    profiled = steps(device, True, None)
    assert profiled.peak_bytes == tracked.peak_bytes
    assert profiled.activation_peak_bytes == tracked.activation_peak_bytes
    # The allocator also hands the foreach kernels the 8- and 4-byte scalars they make of lr and
    # momentum, which are no op's output: the events see them, the dispatch mode does not.
    assert 0 <= (profiled.optimizer_peak_bytes or 0) - (tracked.optimizer_peak_bytes or 0) <= 64
    with pytest.raises(torch.OutOfMemoryError, match="set by batchfit") as refused:
        steps(device, True, tracked.peak_bytes - 1)
    assert "can't allocate memory" in str(refused.value)


def test_a_profiler_of_the_users_own_is_left_running_and_the_error_says_so() -> None:
    # Measuring a compiled step on the CPU takes torch's profiler: a second session inside the
    # user's would end theirs, so the search refuses and their profiler keeps its events.
    model = nn.Linear(8, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    workload = batchfit.Workload(
        torch.compile(model),
        optimizer,
        make_batch=lambda n: (torch.randn(n, 8), torch.randn(n, 2)),
        loss_fn=nn.functional.mse_loss,
    )
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as users:
        with pytest.raises(ConfigurationError, match="run the search outside your own profiler"):
            batchfit.find_batch_size(
                workload, device="cpu", memory_limit="1MiB", sizes=BatchSizes(max_batch_size=64)
            )
        model(torch.randn(3, 8))
        assert torch.autograd._profiler_enabled()
    assert any(event.name == "aten::linear" for event in users.events())

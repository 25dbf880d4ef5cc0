"""``check_data`` on real DataLoaders with real worker processes: a loader that sleeps per item and
one with a CPU-heavy transform are found to be the bottleneck and fixed by workers; in-memory data
is not the bottleneck; the model, optimizer and RNG are left bit-identical; bad input is refused.

Throughput is asserted as ratios with wide margins, never as absolute times. The in-process step
runs on one thread (``one_thread``): on a shared 2-core machine torch's thread pool otherwise
makes a tiny model's step time swing with what else runs, which is not what these tests are about.
"""

from __future__ import annotations

import copy
import multiprocessing
import random
from typing import Any

import numpy as np
import pytest
import torch
from data_workloads import (
    InMemoryItems,
    fast,
    heavy,
    loader_ignoring_batch_size,
    loader_without_batch_size,
    sleepy,
    sleepy_loader,
    small,
    stream_loader,
)
from torch import nn

from batchfit import ConfigurationError, DataCheck, Timing, Workload, check_data
from batchfit.policy.explore.loader_settings import WAIT_SHARE_THRESHOLD, LoaderSearch, LoaderSetting
from batchfit.runtime.data import loop as data_loop

#: Long enough for several batches of the slow datasets (about 70 ms each at 0 workers).
WINDOW_SECONDS = 0.5


def _state(workload: Workload) -> dict[str, Any]:
    optimizer = workload.optimizer
    assert isinstance(optimizer, torch.optim.Optimizer)
    return {
        "model": copy.deepcopy(workload.model.state_dict()),
        "grads": [None if p.grad is None else p.grad.clone() for p in workload.model.parameters()],
        "optimizer": copy.deepcopy(optimizer.state_dict()),
        "training": [module.training for module in workload.model.modules()],
        "torch_rng": torch.get_rng_state(),
        "python_rng": random.getstate(),
        "numpy_rng": np.random.get_state()[1].copy(),
    }


def _same(a: object, b: object) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return bool(np.array_equal(a, b))  # type: ignore[arg-type]
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(map(_same, a, b))
    return a == b


def _mid_training(workload: Workload) -> Workload:
    """Adam state, gradients, a submodule in eval mode: what a search must leave alone."""
    optimizer = workload.optimizer
    assert isinstance(optimizer, torch.optim.Optimizer)
    generator = torch.Generator().manual_seed(1)
    for size in (8, 9):
        optimizer.zero_grad()
        inputs, target = torch.randn(size, 32, generator=generator), torch.randint(0, 4, (size,))
        nn.functional.cross_entropy(workload.model(inputs), target).backward()
        optimizer.step()
    workload.model[2].eval()  # type: ignore[index]
    return workload


@pytest.fixture(scope="module")
def sleepy_check(one_thread: None) -> tuple[DataCheck, Workload, dict[str, Any], dict[str, Any]]:
    """One check of the sleepy dataset, with the workload's state before and after it."""
    workload = _mid_training(sleepy())
    random.random(), np.random.rand()
    before = _state(workload)
    result = check_data(workload, 32, device="cpu", search=LoaderSearch(window_seconds=WINDOW_SECONDS))
    return result, workload, before, _state(workload)


def test_a_loader_that_sleeps_per_item_is_the_bottleneck_and_workers_remove_it(
    sleepy_check: tuple[DataCheck, Workload, dict[str, Any], dict[str, Any]],
) -> None:
    result = sleepy_check[0]
    # At 0 workers about 70 ms of loading and 50 ms of step take turns: 58% of the loop waits.
    assert result.bottleneck and result.data_wait_share > 0.4, result.table()
    assert result.loader_samples_per_second < result.step_samples_per_second
    assert result.together_samples_per_second < result.loader_samples_per_second
    assert result.settings[0].setting == LoaderSetting() and result.settings[0].samples_per_second == (
        result.together_samples_per_second
    )
    assert any(row.setting.num_workers >= 2 for row in result.settings)
    advice = result.recommendation
    assert advice is not None and advice.setting.num_workers >= 1, result.table()
    # Two sleeping workers load a batch every 35 ms, faster than the 50 ms step: the wait is gone.
    assert advice.row.data_wait_share < min(WAIT_SHARE_THRESHOLD, result.data_wait_share / 4), result.table()
    assert (
        advice.gain > 1.5
        and advice.gain == advice.row.samples_per_second / result.together_samples_per_second
    )
    assert result.summary().startswith("the loader is the bottleneck at batch_size=32: ")
    assert advice.summary().startswith(f"use {advice.setting.describe()}: {advice.gain:.2f}x the samples/s")
    # The CPU step's share of the loop is the rest of it, less the loop's own few percent.
    assert 0.9 < result.device_busy_share + result.data_wait_share <= 1.0 + 1e-9
    assert result.batches_per_epoch == 1024 // 32
    assert multiprocessing.active_children() == []  # every worker was shut down


def test_check_data_leaves_model_optimizer_and_rng_bit_identical(
    sleepy_check: tuple[DataCheck, Workload, dict[str, Any], dict[str, Any]],
) -> None:
    _, _, before, after = sleepy_check
    for key in before:
        assert _same(before[key], after[key]), key


def test_the_result_as_json_and_text(
    sleepy_check: tuple[DataCheck, Workload, dict[str, Any], dict[str, Any]],
) -> None:
    result = sleepy_check[0]
    document = result.to_dict()
    assert document["recommendation"]["setting"] == result.recommendation.setting.to_dict()  # type: ignore[union-attr]
    assert [row["num_workers"] for row in document["settings"]] == [
        row.setting.num_workers for row in result.settings
    ]
    assert document["summary"] == result.summary() and result.to_json().endswith("}\n")
    table = result.table()
    assert table.splitlines()[-1] == result.summary()
    assert "<- current" in table and "recommended" in table
    assert "note: pin_memory not tried: on the CPU there is no host-to-device copy" in table


def test_a_cpu_heavy_transform_is_the_bottleneck_and_a_worker_overlaps_it(one_thread: None) -> None:
    # About 35 ms of arithmetic a batch at 0 workers, in turn with the 50 ms step: one worker
    # computes the next batch while the step runs.
    result = check_data(heavy(), 32, device="cpu", search=LoaderSearch(window_seconds=WINDOW_SECONDS))
    assert result.bottleneck and result.data_wait_share > 0.2, result.table()
    advice = result.recommendation
    assert advice is not None and advice.setting.num_workers >= 1, result.table()
    assert advice.gain > 1.25, result.table()
    assert advice.row.data_wait_share < result.data_wait_share / 2, result.table()


def test_in_memory_data_with_a_heavier_step_is_not_the_bottleneck(one_thread: None) -> None:
    result = check_data(fast(), 128, device="cpu", search=LoaderSearch(window_seconds=WINDOW_SECONDS))
    assert not result.bottleneck and result.data_wait_share < WAIT_SHARE_THRESHOLD, result.table()
    assert result.loader_samples_per_second > 5 * result.step_samples_per_second, result.table()
    assert result.recommendation is None and result.stop_reason == "not_bottleneck"
    assert [row.setting for row in result.settings] == [LoaderSetting()]  # nothing else tried
    assert result.summary().startswith("the loader is not the bottleneck at batch_size=128: ")


def test_no_timed_step_is_one_a_fresh_scaler_skips_for_overflow(
    one_thread: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Skipped for overflow, a step runs no optimizer: timed, it made the step alone look faster
    # than training's. The step's warm-up steps on until the scale stops coming down.
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
    scaler = torch.amp.GradScaler("cpu")
    skipped: list[bool] = []  # per step: whether the scaler skipped it

    def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, batch: Any) -> None:
        scale = scaler.get_scale()
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.float16):
            loss = nn.functional.cross_entropy(model(batch[0]), batch[1]) * 1e3  # overflows at first
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        skipped.append(scaler.get_scale() < scale)

    workload = Workload(
        model, torch.optim.Adam(model.parameters()), dataset=InMemoryItems(), train_step=train_step
    )
    timed_from: list[int] = []  # the steps run before each timed run of steps
    real_timed_steps = data_loop.timed_steps

    def spied(*args: Any, **kwargs: Any) -> float:
        timed_from.append(len(skipped))
        return real_timed_steps(*args, **kwargs)

    monkeypatch.setattr(data_loop, "timed_steps", spied)
    check_data(workload, 32, device="cpu", search=LoaderSearch(max_num_workers=0, window_seconds=0.05))
    assert timed_from and sum(skipped[: timed_from[0]]) > 2  # the warm-up met them
    assert not any(skipped[timed_from[0] :])


def test_a_factory_is_given_only_the_knobs_it_takes(one_thread: None) -> None:
    seen: list[dict[str, Any]] = []

    def factory(batch_size: int, num_workers: int) -> Any:
        seen.append({"batch_size": batch_size, "num_workers": num_workers})
        return sleepy_loader(batch_size, num_workers)

    result = check_data(
        sleepy(),
        32,
        device="cpu",
        loader=factory,
        search=LoaderSearch(window_seconds=0.2),
        timing=Timing(time_budget_seconds=0),
    )
    assert result.source.startswith("loader=") and result.source.endswith("factory")
    assert {call["batch_size"] for call in seen} == {32}
    # The time budget is spent by the first three passes: no setting is tried after them.
    assert result.stop_reason == "time_budget" and len(result.settings) == 1
    assert result.recommendation is not None and result.recommendation.setting == LoaderSetting()
    assert "prefetch_factor, pin_memory, persistent_workers not tried:" in result.table()


class StepFailed(Exception):
    pass


def test_an_error_in_the_step_propagates_with_a_note_and_the_state_put_back(one_thread: None) -> None:
    workload = _mid_training(sleepy())
    workload.dataset = InMemoryItems()
    calls = []

    def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, batch: Any) -> None:
        calls.append(len(batch[0]))
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(batch[0]), batch[1]).backward()
        optimizer.step()  # weights, Adam state and (dropout) RNG change before the failure
        if len(calls) == 3:
            raise StepFailed("a bug in the step")

    workload.train_step = train_step
    before = _state(workload)
    with pytest.raises(StepFailed) as info:
        check_data(workload, 16, device="cpu", search=LoaderSearch(window_seconds=0.05))
    assert info.value.__notes__ == ["batchfit: raised by the train step in check_data at batch_size=16."]
    after = _state(workload)
    for key in before:
        assert _same(before[key], after[key]), key


@pytest.mark.parametrize(
    ("build", "arguments", "message"),
    [
        pytest.param(
            sleepy, {"batch_size": 0}, "batch_size must be a positive integer, got 0.", id="batch-0"
        ),
        pytest.param(
            small,
            {"batch_size": 32},
            "Workload.dataset holds 10 items, fewer than batch_size=32: not one full batch to time; "
            "pass batch_size <= 10, or a larger dataset.",
            id="dataset-smaller-than-a-batch",
        ),
        pytest.param(
            sleepy,
            {"batch_size": 32, "loader": stream_loader},
            "the dataset of loader=stream_loader's DataLoader is an IterableDataset (Stream): check_data "
            "measures map-style datasets, where num_workers splits the batches between the workers (an "
            "iterable one must shard itself per worker, or every worker yields the same samples); give "
            "it a map-style dataset (with __len__ and __getitem__).",
            id="iterable-dataset",
        ),
        pytest.param(
            sleepy,
            {"batch_size": 32, "loader": loader_without_batch_size},
            "loader=loader_without_batch_size takes no batch_size parameter (its parameters: "
            "(num_workers)); check_data calls loader(batch_size=N, num_workers=N, ...) -> DataLoader: "
            "add a batch_size parameter and build the DataLoader with it.",
            id="factory-without-batch-size",
        ),
        pytest.param(
            sleepy,
            {"batch_size": 32, "loader": loader_ignoring_batch_size},
            "loader=loader_ignoring_batch_size yielded a first batch of 8 samples, not batch_size=32; "
            "its DataLoader must be built with the batch_size it is given.",
            id="factory-ignoring-batch-size",
        ),
        pytest.param(
            sleepy,
            {"batch_size": 32, "loader": sleepy_loader, "pin_memory": True},
            "loader=sleepy_loader has no pin_memory parameter, so pin_memory=True cannot be passed to "
            "it; add the parameter, or leave pin_memory at its default.",
            id="knob-the-factory-lacks",
        ),
        pytest.param(
            sleepy,
            {"batch_size": 32, "tolerance": 1.0},
            "tolerance=1.0 must be in [0, 1), e.g. 0.03 for 3%.",
            id="tolerance-1",
        ),
    ],
)
def test_bad_input_names_the_parameter(build: Any, arguments: dict[str, Any], message: str) -> None:
    arguments = dict(arguments)
    batch_size = arguments.pop("batch_size")
    with pytest.raises(ConfigurationError) as info:
        searching = {
            name: arguments.pop(name) for name in list(arguments) if name in LoaderSearch.__dataclass_fields__
        }
        setting = {
            name: arguments.pop(name)
            for name in list(arguments)
            if name in LoaderSetting.__dataclass_fields__
        }
        search = LoaderSearch(**{"window_seconds": 0.05, **searching}, current=LoaderSetting(**setting))
        check_data(build(), batch_size, device="cpu", search=search, **arguments)
    assert str(info.value) == message


def test_a_workload_without_a_dataset_or_a_loader_is_refused() -> None:
    workload = Workload(model=nn.Linear(2, 2), make_batch=lambda n: torch.zeros(n, 2), name="made")
    with pytest.raises(ConfigurationError) as info:
        check_data(workload, 4, device="cpu")
    assert str(info.value) == (
        "check_data needs batches from a DataLoader, and workload 'made' makes them with make_batch; "
        "give the Workload a map-style dataset (dataset=..., collate_fn=...) or pass loader=a factory "
        "(batch_size=..., num_workers=...) -> DataLoader (on the command line: --loader MODULE:FUNCTION)."
    )


@pytest.mark.gpu
def test_on_cuda_the_device_busy_share_is_measured_with_events() -> None:
    workload = sleepy()
    workload.model.to("cuda")
    result = check_data(workload, 32, device="cuda", search=LoaderSearch(window_seconds=WINDOW_SECONDS))
    print(result.table())  # the figures, in the gpu session's log (pytest -rP)
    assert result.device.startswith("cuda")
    # The step is a tiny model's real step and 50 ms of the host waiting, as for an accelerator;
    # about 70 ms of loading a batch beside it. The events around each step see the 50 ms (the
    # stream idles through them, inside the step): busy and waiting make up the loop between them.
    assert result.data_wait_share > 0.4 and 0.2 < result.device_busy_share < 0.6, result.table()
    assert abs(result.device_busy_share + result.data_wait_share - 1) < 0.1, result.table()
    assert result.bottleneck and result.recommendation is not None
    assert any(row.setting.pin_memory for row in result.settings)  # tried on CUDA

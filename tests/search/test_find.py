"""find_batch_size on real tiny models: exact against brute force, and leaves no trace."""

from __future__ import annotations

import collections
import copy
import dataclasses
import gc
import itertools
import random
import re
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from tiny_workloads import (
    adversarial,
    build,
    classification_batch,
    float16_scaled,
    large_batch_workspace,
    lbfgs_mlp,
    overflowing_workload,
    queue_workload,
    sparse_embedding_workload,
    tiny_mlp,
    trials_into,
    untraceable,
)
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor

import batchfit
from batchfit import BatchSizes, ConfigurationError, DoesNotFitError, Trials, Workload, find_batch_size
from batchfit.errors import DeviceUnavailableError
from batchfit.policy.search.search import DEFAULT_TUNING, Tuning
from batchfit.policy.search.trial import Trial
from batchfit.runtime.devices.caching_device import CachingCpuDevice
from batchfit.runtime.workloads.examples import build_example
from batchfit.search.find_batch_size import find_on
from batchfit.where import ResolvedDevice


def brute_force(
    kind: str, mode: str, limit: int, fraction: float, max_batch_size: int, optimizer: str
) -> int:
    """Run every batch size on a fresh copy of the workload under the cap; the largest that fits."""
    best = 0
    for batch_size in range(1, max_batch_size + 1):
        workload = build(kind, optimizer)
        model, opt = workload.model, workload.optimizer
        assert isinstance(opt, torch.optim.Optimizer) and workload.make_batch is not None
        inputs, target = workload.make_batch(batch_size)
        warm = workload.make_batch(1)
        try:
            if mode == "eval":  # validation inside training: gradients and optimizer state resident
                nn.functional.cross_entropy(model(warm[0]), warm[1]).backward()
                opt.step()
            with batchfit.cap_memory(limit, resident=[model, opt]) as tracker:
                if mode == "train":
                    model.train()
                    for _ in range(2):
                        x, y = inputs.clone(), target.clone()
                        opt.zero_grad(set_to_none=True)
                        nn.functional.cross_entropy(model(x), y).backward()
                        opt.step()
                        del x, y
                else:
                    model.eval()
                    with torch.no_grad():
                        for _ in range(2):
                            x, y = inputs.clone(), target.clone()
                            nn.functional.cross_entropy(model(x), y)
                            del x, y
        except torch.OutOfMemoryError:
            continue
        if tracker.peak_bytes <= int(fraction * limit):
            best = batch_size
    return best


@pytest.mark.parametrize(
    ("kind", "optimizer", "limit"),
    [
        ("mlp", "sgd", 1_300_000),
        ("cnn", "sgd", 2_000_000),
        pytest.param("mlp", "adam", 2_400_000, marks=pytest.mark.slow),
        pytest.param("cnn", "sgd", 3_000_000, marks=pytest.mark.slow),
        pytest.param("cnn", "adam", 6_000_000, marks=pytest.mark.slow),
    ],
)
@pytest.mark.parametrize("fraction", [0.8, 1.0])
def test_train_answer_is_the_true_maximum(kind: str, optimizer: str, limit: int, fraction: float) -> None:
    result = find_batch_size(
        build(kind, optimizer),
        "train",
        device="cpu",
        memory_limit=limit,
        memory_fraction=fraction,
        sizes=BatchSizes(max_batch_size=400),
    )
    truth = brute_force(kind, "train", limit, fraction, min(400, result.batch_size + 3), optimizer)
    assert result.batch_size == truth
    assert result.peak_bytes <= result.budget_bytes == int(fraction * limit)
    assert len(result.trials) <= 14


@pytest.mark.parametrize(
    ("kind", "limit"), [("cnn", 3_000_000), pytest.param("mlp", 3_000_000, marks=pytest.mark.slow)]
)
def test_eval_answer_is_the_true_maximum(kind: str, limit: int) -> None:
    result = find_batch_size(
        build(kind, "adam"), "eval", device="cpu", memory_limit=limit, memory_fraction=0.9
    )
    assert result.mode == "eval" and result.max_batch_size == 1024
    assert result.batch_size == brute_force(kind, "eval", limit, 0.9, result.batch_size + 3, "adam")


def test_result_holds_the_evidence(mlp_workload: Workload) -> None:
    seen: list[Trial] = []
    result = find_batch_size(mlp_workload, device="cpu", memory_limit="3MiB", on_progress=trials_into(seen))
    assert tuple(seen) == result.trials
    document = result.to_dict()
    assert document["batch_size"] == result.batch_size and document["stop_reason"] == "boundary"
    assert {t["outcome"] for t in document["trials"]} >= {"ok"}
    assert document["search_seconds"] > 0
    # A fake-tensor trace placed the real trials: the predicted answer, then the next batch.
    assert [t.batch_size for t in result.predicted_trials][:2] == [2, 4]
    assert [t.batch_size for t in result.trials] == [result.batch_size, result.batch_size + 1]
    assert document["predicted_trials"][0]["step_seconds"] is None
    answer = next(t for t in result.trials if t.batch_size == result.batch_size)
    after = next(t for t in result.trials if t.batch_size == result.batch_size + 1)
    assert answer.outcome == "ok" and after.outcome in ("oom", "over_budget")
    assert answer.step_seconds is not None and answer.step_seconds > 0
    model = result.memory_model
    assert model is not None and model.bytes_per_sample > 0
    assert batchfit.SearchResult(**{**result.__dict__}) == result
    assert '"mode": "train"' in result.to_json()


def test_the_summary_says_when_the_answer_needed_allocator_retries(mlp_workload: Workload) -> None:
    result = find_batch_size(mlp_workload, device="cpu", memory_limit="3MiB")
    assert "allocator retries" not in result.summary()  # the CPU's tracker never retries
    answer = dataclasses.replace(result.answer, allocator_retries=3)
    trials = tuple(answer if t is result.answer else t for t in result.trials)
    retried = dataclasses.replace(result, trials=trials)
    assert retried.answer.allocator_retries == 3
    assert retried.summary().endswith(
        "; stopped because the next larger candidate did not fit. Its steps needed 3 allocator retries "
        "under the cap (the allocator freed its cache to go on, which costs time); a smaller batch may "
        "train faster."
    )


def test_the_summary_counts_its_trials_in_words(mlp_workload: Workload) -> None:
    # The forecast places one real trial at max_batch_size, which fits: "1 trial", not "1 trials".
    result = find_batch_size(
        mlp_workload, device="cpu", memory_limit="64MiB", sizes=BatchSizes(max_batch_size=8)
    )
    assert len(result.trials) == 1 and len(result.predicted_trials) > 1
    assert f"); 1 trial (placed by {len(result.predicted_trials)} fake-tensor traces) in " in result.summary()


def test_multiple_of_and_bounds(mlp_workload: Workload) -> None:
    result = find_batch_size(
        mlp_workload, device="cpu", memory_limit="4MiB", sizes=BatchSizes(multiple_of=8, min_batch_size=8)
    )
    assert result.batch_size % 8 == 0 and all(t.batch_size % 8 == 0 for t in result.trials)
    capped = find_batch_size(
        mlp_workload, device="cpu", memory_limit="64MiB", sizes=BatchSizes(max_batch_size=24)
    )
    assert (capped.batch_size, capped.stop_reason) == (24, "max_batch_size")


def test_steady_state_peak_includes_optimizer_state() -> None:
    workload = build("cnn", "adam")
    kwargs = {"device": "cpu", "memory_limit": "64MiB", "sizes": BatchSizes(32, 32)}
    one = find_batch_size(workload, **kwargs, trials=Trials(steps_per_trial=1))  # type: ignore[arg-type]
    two = find_batch_size(workload, **kwargs, trials=Trials(steps_per_trial=2))  # type: ignore[arg-type]
    params = list(workload.model.parameters())
    adam_state = 2 * sum(p.numel() * 4 for p in params) + 4 * len(params)  # two moments + a step count each
    # Adam's state is created inside the first step; the second step's backward carries it.
    assert two.peak_bytes - one.peak_bytes == adam_state


def _state(workload: Workload) -> dict[str, object]:
    opt = workload.optimizer
    assert isinstance(opt, torch.optim.Optimizer)
    return {
        "model": copy.deepcopy(workload.model.state_dict()),
        "grads": [None if p.grad is None else p.grad.clone() for p in workload.model.parameters()],
        "optimizer": copy.deepcopy(opt.state_dict()),
        "training": [m.training for m in workload.model.modules()],
        "torch_rng": torch.get_rng_state(),
        "python_rng": random.getstate(),
        "numpy_rng": np.random.get_state()[1].copy(),
    }


def _assert_identical(before: dict[str, object], after: dict[str, object]) -> None:
    def same(a: object, b: object) -> bool:
        if isinstance(a, torch.Tensor):
            return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
        if isinstance(a, np.ndarray):
            return bool(np.array_equal(a, b))  # type: ignore[arg-type]
        if isinstance(a, dict):
            return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
        if isinstance(a, (list, tuple)):
            return isinstance(b, (list, tuple)) and len(a) == len(b) and all(map(same, a, b))
        return a == b

    for key in before:
        assert same(before[key], after[key]), key


def _trained(workload: Workload) -> Workload:
    """A workload mid-training: optimizer state and BatchNorm statistics exist, gradients are set."""
    opt = workload.optimizer
    assert isinstance(opt, torch.optim.Optimizer) and workload.make_batch is not None
    for n in (4, 6):
        opt.zero_grad()
        x, y = workload.make_batch(n)
        nn.functional.cross_entropy(workload.model(x), y).backward()
        opt.step()
    workload.model[1].eval()  # a submodule in eval mode must stay so
    return workload


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_search_leaves_everything_bit_identical(kind: str) -> None:
    workload = _trained(build(kind, "adam"))
    params = [id(p) for p in workload.model.parameters()]
    random.random(), np.random.rand()
    before = _state(workload)
    for mode in ("train", "eval"):
        find_batch_size(workload, mode, device="cpu", memory_limit="6MiB")  # type: ignore[arg-type]
    _assert_identical(before, _state(workload))
    assert [id(p) for p in workload.model.parameters()] == params


class Boom(Exception):
    pass


@pytest.mark.parametrize("error", [Boom("bad batch"), KeyboardInterrupt()])
def test_restored_after_an_exception_mid_trial(error: BaseException) -> None:
    workload = _trained(build("cnn", "adam"))
    before = _state(workload)
    calls = []  # the batch size of each real step (the fake-tensor forecast's steps are not counted)

    def train_step(model: nn.Module, opt: torch.optim.Optimizer, batch: tuple[torch.Tensor, ...]) -> None:
        real = not isinstance(batch[0], FakeTensor)
        calls.extend([batch[0].shape[0]] if real else [])
        opt.zero_grad()
        nn.functional.cross_entropy(model(batch[0]), batch[1]).backward()
        opt.step()  # weights and Adam state are changed before the failure
        torch.rand(3), random.random()  # and the RNGs advanced
        if real and len(calls) == 2:  # the first trial's second step
            raise error

    workload.train_step = train_step
    with pytest.raises(type(error)) as info:
        find_batch_size(workload, device="cpu", memory_limit="6MiB")
    assert info.value is error  # the same exception, unchanged
    step = len(list(itertools.takewhile(lambda size: size == calls[-1], reversed(calls))))  # of its trial
    if isinstance(error, Exception):  # the trial and step it was raised in, which it names
        note = f"batchfit: raised by the train step at batch_size={calls[-1]}, step {step} of 2."
        assert error.__notes__ == [note]
    else:  # a Ctrl-C is not raised by the step: nothing names it so
        assert getattr(error, "__notes__", []) == []
    _assert_identical(before, _state(workload))


def test_non_oom_error_propagates_at_once() -> None:
    workload = build("mlp")
    workload.loss_fn = lambda output, target: output.sum() + target.view(3, -1).sum()  # breaks at n=2
    with pytest.raises(RuntimeError, match="shape '\\[3, -1\\]' is invalid") as info:
        find_batch_size(workload, device="cpu", memory_limit="64MiB")
    assert info.value.__notes__ == ["batchfit: raised by the train step at batch_size=2, step 1 of 2."]


def _live_tensor_bytes() -> int:
    gc.collect()
    storages = {}
    for obj in gc.get_objects():
        if type(obj) in (torch.Tensor, nn.Parameter) and obj.device.type == "cpu":
            storages[obj.untyped_storage().data_ptr()] = obj.untyped_storage().nbytes()
    return sum(storages.values())


def test_memory_is_back_where_it_was() -> None:
    workload = _trained(build("cnn", "adam"))
    before = _live_tensor_bytes()
    for _ in range(2):
        find_batch_size(workload, device="cpu", memory_limit="5MiB")
    assert _live_tensor_bytes() == before


def test_optimizer_factory_and_slices_count_their_own_bytes() -> None:
    torch.manual_seed(0)
    model = nn.Linear(64, 10)
    pool_x, pool_y = torch.randn(100_000, 64), torch.randint(0, 10, (100_000,))  # 25.6 MB
    workload = Workload(
        model=model,
        optimizer=lambda params: torch.optim.SGD(params, lr=0.1),
        make_batch=lambda n: (pool_x[:n], pool_y[:n]),
        loss_fn=nn.functional.cross_entropy,
    )
    result = find_batch_size(
        workload,
        device="cpu",
        memory_limit="1MiB",
        memory_fraction=1.0,
        sizes=BatchSizes(max_batch_size=10_000),
    )
    # Each sample costs its own 64 floats (+ label, activations, gradients), not the 25.6 MB pool.
    assert 1000 < result.batch_size < 4000


def test_an_eval_search_beside_the_training_state_counts_its_warm_up_batch_not_the_dataset() -> None:
    # A TensorDataset's items are views of its tensors. The training step that makes the state
    # resident before an eval trial collates its batch on the host, as every trial does: the
    # dataset's 1 MiB is not counted against the 1 MiB device, and the answer is the one found on
    # the same samples made apart (copies).
    torch.manual_seed(0)
    features, labels = torch.randn(4096, 64), torch.randint(0, 10, (4096,))
    sources: dict[str, dict[str, Any]] = {
        "dataset": {"dataset": torch.utils.data.TensorDataset(features, labels)},
        "copies": {"make_batch": lambda n: (features[:n].clone(), labels[:n].clone())},
    }
    answers = {}
    for name, source in sources.items():
        model = nn.Linear(64, 10)
        optimizer = torch.optim.Adam(model.parameters())
        workload = Workload(model, optimizer, loss_fn=nn.functional.cross_entropy, **source)
        sizes = BatchSizes(max_batch_size=4096)
        answers[name] = find_batch_size(
            workload, "eval", device="cpu", memory_limit="1MiB", sizes=sizes
        ).batch_size
    assert answers["dataset"] == answers["copies"] > 1000


def test_dataset_largest_items_first() -> None:
    torch.manual_seed(0)
    lengths = [5, 50, 7, 200, 9, 11, 13, 150]
    data = [(torch.randn(length, 8), torch.tensor(1)) for length in lengths]

    def collate(items: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
        longest = max(x.shape[0] for x, _ in items)
        padded = torch.zeros(len(items), longest, 8)
        for i, (x, _) in enumerate(items):
            padded[i, : x.shape[0]] = x
        return padded, torch.stack([y for _, y in items])

    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2))
    workload = Workload(
        model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        dataset=data,
        collate_fn=collate,
        loss_fn=lambda out, y: nn.functional.cross_entropy(out.mean(1), y),
    )
    assert workload.host_batch(2)[0].shape == (2, 200, 8)  # the 200 and the 150
    assert workload.host_batch(10)[0].shape == (10, 200, 8)  # more than the dataset: cycles
    by_key = Workload(
        model=model,
        optimizer=workload.optimizer,
        dataset=data,
        collate_fn=collate,
        size_key=lambda item: -item[0].shape[0],
        loss_fn=workload.loss_fn,
    )
    assert by_key.host_batch(1)[0].shape == (1, 5, 8)  # the user's key decides what is largest
    result = find_batch_size(
        workload, device="cpu", memory_limit="512KiB", sizes=BatchSizes(max_batch_size=64)
    )
    assert result.batch_size >= 1


BAD_INPUTS = [
    (
        {"memory_fraction": 1.5},
        ConfigurationError,
        "memory_fraction=1.5 must be in (0, 1]: the share of device memory a batch may use.",
    ),
    ({"memory_fraction": 0}, ConfigurationError, "memory_fraction=0 must be in (0, 1]"),
    (
        {"min_batch_size": 9, "max_batch_size": 4},
        ConfigurationError,
        "min_batch_size (9) is larger than max_batch_size (4)",
    ),
    ({"min_batch_size": 0}, ConfigurationError, "min_batch_size must be a positive integer, got 0."),
    ({"steps_per_trial": 0}, ConfigurationError, "steps_per_trial must be a positive integer, got 0."),
    ({"mode": "test"}, ConfigurationError, "mode='test' is not a mode: use 'train' or 'eval' (or 'val')."),
    ({"device": "tpu"}, ConfigurationError, "device='tpu' is not a device: use 'cpu', 'cuda' or 'cuda:N'."),
    ({"device": "mps"}, ConfigurationError, "device='mps' is not supported"),
    ({"device": "cuda"}, DeviceUnavailableError, "device='cuda' was asked for, but CUDA is not available"),
    ({"memory_limit": "lots"}, ConfigurationError, "memory_limit='lots' is not a size"),
]


@pytest.mark.parametrize(("kwargs", "error", "message"), BAD_INPUTS)
def test_bad_input(mlp_workload: Workload, kwargs: dict[str, object], error: type, message: str) -> None:
    if kwargs.get("device") == "cuda" and torch.cuda.is_available():
        pytest.skip("CUDA is present here")
    before = _state(mlp_workload)
    given = {"device": "cpu", "memory_limit": "8MiB", **kwargs}
    with pytest.raises(error) as info:
        for name, kind in (("sizes", BatchSizes), ("trials", Trials)):
            fields = {key: given.pop(key) for key in list(given) if key in kind.__dataclass_fields__}
            given[name] = kind(**fields)
        find_batch_size(mlp_workload, **given)  # type: ignore[arg-type]
    assert message in str(info.value)
    assert isinstance(info.value, batchfit.BatchfitError)
    _assert_identical(before, _state(mlp_workload))


def test_make_batch_of_the_wrong_size() -> None:
    model = nn.Linear(4, 2)
    workload = Workload(
        model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        make_batch=lambda n: (torch.randn(4, 4), torch.zeros(4, dtype=torch.long)),
        loss_fn=nn.functional.cross_entropy,
    )
    with pytest.raises(ConfigurationError) as info:
        find_batch_size(workload, device="cpu", memory_limit="1MiB")
    assert str(info.value) == (
        "make_batch(2) returned a batch of 4 samples (its first tensor has shape (4, 4), batch_dim=0), "
        "not 2; make_batch(n) must return exactly n samples along batch_dim."
    )


def test_model_that_does_not_fit_at_batch_one(mlp_workload: Workload) -> None:
    with pytest.raises(DoesNotFitError) as info:
        find_batch_size(mlp_workload, device="cpu", memory_limit="400KiB")
    message = str(info.value)
    assert message.startswith(
        "the train step does not fit even at batch_size=1 on cpu (capped at 400.00 KiB)"
    )
    assert "The fixed part alone, parameters and buffers, takes 332.04 KiB" in message
    assert "against a budget of 320.00 KiB (0.8 x 400.00 KiB)" in message
    assert "Raise memory_limit, or memory_fraction=0.8 toward 1, or shrink" in message


def test_workload_errors() -> None:
    with pytest.raises(ConfigurationError, match=r"exactly one source of batches"):
        Workload(model=nn.Linear(2, 2))
    with pytest.raises(ConfigurationError, match=r"Workload\.model must be a torch\.nn\.Module, got str"):
        Workload(model="resnet", make_batch=lambda n: n)  # type: ignore[arg-type]
    no_optimizer = Workload(model=nn.Linear(2, 2), make_batch=lambda n: torch.randn(n, 2))
    with pytest.raises(ConfigurationError, match=r"mode='train' needs Workload\.optimizer"):
        find_batch_size(no_optimizer, device="cpu", memory_limit="1MiB")
    # Without an optimizer the eval search needs none.
    assert find_batch_size(no_optimizer, "eval", device="cpu", memory_limit="64KiB").batch_size > 1


def test_model_on_another_device_is_named() -> None:
    # find, explore (also with its own max_batch_size: no search) and check_data all say so before
    # any step, rather than torch's device mismatch from inside one.
    model = nn.Linear(2, 2).to("meta")
    data = torch.utils.data.TensorDataset(torch.randn(16, 2), torch.randn(16, 2))
    workload = Workload(model=model, optimizer=lambda p: torch.optim.SGD(p, lr=0.1), dataset=data)
    named = (
        r"^the model's weight is on the meta device, which holds shapes but no memory, so no step runs on "
        r"cpu; predict its batch sizes from the shapes alone with batchfit\.predict\("
    )
    with pytest.raises(ConfigurationError, match=named):
        find_batch_size(workload, device="cpu")
    with pytest.raises(ConfigurationError, match=named):
        batchfit.explore(workload, device="cpu", sizes=BatchSizes(max_batch_size=4))
    with pytest.raises(ConfigurationError, match=named):
        batchfit.check_data(workload, 4, device="cpu")


def test_uncapped_cpu_uses_the_host_capacity(mlp_workload: Workload) -> None:
    from batchfit.runtime.devices.device import host_available_bytes

    result = find_batch_size(mlp_workload, device="cpu", sizes=BatchSizes(max_batch_size=32))
    assert result.batch_size == 32 and result.device == "cpu"
    params = sum(
        t.untyped_storage().nbytes()
        for t in batchfit.runtime.devices.tracker.resident_tensors(mlp_workload.model)
    )
    assert 0 < result.capacity_bytes - params <= host_available_bytes() * 1.1


def test_progress_events_bracket_every_trial(mlp_workload: Workload) -> None:
    events: list[batchfit.Event] = []
    result = find_batch_size(mlp_workload, device="cpu", memory_limit="3MiB", on_progress=events.append)
    expected = [(stage, trial.batch_size) for trial in result.trials for stage in ("started", "trial")]
    assert [(event.stage, event.batch_size) for event in events] == expected
    assert {(event.verb, event.label) for event in events} == {("find", "train")}
    assert [event.trial for event in events if event.stage == "trial"] == list(result.trials)


class HistorySGD(torch.optim.SGD):
    """SGD that keeps its last ``keep`` gradients in its state, as L-BFGS and gradient-averaging
    methods do: its memory grows over the first ``keep`` steps, so two steps do not show it."""

    def __init__(self, params: Any, keep: int = 8, lr: float = 0.1) -> None:
        super().__init__(params, lr=lr)
        self.keep = keep

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        for group in self.param_groups:
            for parameter in group["params"]:
                if parameter.grad is not None:
                    history = self.state[parameter].setdefault("history", [])
                    history.append(parameter.grad.clone())
                    del history[: -self.keep]
        return super().step(closure)


def _history_workload() -> Workload:
    torch.manual_seed(0)
    model = tiny_mlp()
    return Workload(
        model=model,
        optimizer=HistorySGD(model.parameters()),
        make_batch=classification_batch((64,)),
        loss_fn=nn.functional.cross_entropy,
        name="history",
    )


def _trains(batch_size: int, steps: int, limit: int) -> bool:
    """Whether ``steps`` steps from the freshly built workload complete under a cap of ``limit``."""
    workload = _history_workload()
    assert workload.make_batch is not None and isinstance(workload.optimizer, torch.optim.Optimizer)
    inputs, target = workload.make_batch(batch_size)
    try:
        with batchfit.cap_memory(limit, resident=[workload.model, workload.optimizer]):
            for _ in range(steps):
                workload.optimizer.zero_grad(set_to_none=True)
                nn.functional.cross_entropy(workload.model(inputs.clone()), target.clone()).backward()
                workload.optimizer.step()
    except torch.OutOfMemoryError:
        return False
    return True


def test_confirm_steps_hold_the_answer_to_longer_training() -> None:
    # The memory grows over the first 8 steps (as a caching allocator's fragmentation does on
    # CUDA, where confirm_steps is 10 by default): the 2-step answer fails within 10 steps. The
    # traces' answer (2 steps) is the first real trial, and it and every trial after it aim at
    # the answer and run 10 steps, so the search ends at what trains 10 steps.
    limit = 5_000_000
    workload = _history_workload()
    short = find_batch_size(workload, device="cpu", memory_limit=limit, memory_fraction=1.0)
    assert short.confirm_steps is None and _trains(short.batch_size, 2, limit)
    assert not _trains(short.batch_size, 10, limit)

    seen: list[Trial] = []
    result = find_batch_size(
        workload,
        device="cpu",
        memory_limit=limit,
        memory_fraction=1.0,
        on_progress=trials_into(seen),
        trials=Trials(confirm_steps=10),
    )
    assert result.confirm_steps == 10 and result.answer.steps == 10 and result.answer.fits
    assert result.batch_size < short.batch_size and result.stop_reason == "boundary"
    assert list(result.trials) == seen
    assert short.predicted_trials and result.predicted_trials  # HistorySGD's own attribute reaches the traces
    assert all(trial.steps == 10 for trial in result.trials)
    aimed = result.trials[0]  # where the 2-step search ended: it does not train 10 steps
    assert aimed.batch_size == short.batch_size and not aimed.fits
    # Refuted, the traces' 2-step peaks leave the line: the 10-step trials alone place the rest
    # (2, 4, 258, 385, 442, 443; with the traces' peaks in the line it crept up in 14 trials).
    assert len(result.trials) <= 7
    # The truth by force: the answer trains 10 steps. (A trial holds one more label tensor at its
    # peak than this loop, 8 bytes a sample, so the next batch up can squeeze in here; two cannot.)
    assert _trains(result.batch_size, 10, limit) and not _trains(result.batch_size + 2, 10, limit)
    assert "the answer confirmed over 10 steps" in result.summary()


def test_after_the_opening_the_search_runs_the_confirming_trial() -> None:
    # No forecast (the step reads a value): real trials from 2 and 4, and this mlp's line through
    # them overshoots (its memory is mostly fixed). After the opening every trial may be the
    # answer, so each runs confirm_steps: the answer is proven by its own longer trial, at no
    # trial of its own, and the search tries what the plain search tries (the capped CPU's step 2
    # is every later step).
    limit = 1_500_000
    plain = find_batch_size(untraceable("mlp"), device="cpu", memory_limit=limit, memory_fraction=1.0)
    result = find_batch_size(
        untraceable("mlp"),
        device="cpu",
        memory_limit=limit,
        memory_fraction=1.0,
        trials=Trials(confirm_steps=4),
    )
    assert not result.predicted_trials and result.stop_reason == "boundary"
    assert result.batch_size == plain.batch_size
    assert [t.batch_size for t in result.trials] == [t.batch_size for t in plain.trials]
    assert [trial.steps for trial in result.trials] == [2, 2] + [4] * (len(result.trials) - 2)
    assert any(not trial.fits for trial in result.trials[2:])  # failures ran the longer trial too
    assert result.answer.steps == 4 and result.answer.fits
    assert "the answer confirmed over 4 steps" in result.summary()


def test_confirm_steps_must_be_positive(mlp_workload: Workload) -> None:
    with pytest.raises(ConfigurationError, match="confirm_steps"):
        find_batch_size(mlp_workload, device="cpu", memory_limit="3MiB", trials=Trials(confirm_steps=0))


def trains(build_fresh: Callable[[], Workload], batch_size: int, limit: str, steps: int) -> bool:
    """Whether ``steps`` steps of a freshly built workload at ``batch_size`` complete under a cap
    of ``limit``: the truth by force."""
    workload = build_fresh()
    optimizer = workload.build_optimizer()
    inputs, target = workload.host_batch(batch_size)
    try:
        with batchfit.cap_memory(limit, resident=[workload.model, optimizer]) as measured:
            for _ in range(steps):
                workload.run_train_step(optimizer, (inputs.clone(), target.clone()))
    except torch.OutOfMemoryError:
        return False
    except RuntimeError:
        if measured.refused:  # the cap's, re-raised without its message by TorchScript
            return False
        raise
    return True


def scaled_cnn(scaler: torch.amp.GradScaler) -> Workload:
    """The tiny CNN trained in float16 autocast with ``scaler``, as mixed-precision training is."""
    return float16_scaled(build("cnn", "sgd"), scaler)


def test_a_grad_scaler_in_the_step_is_measured_for_real_and_left_as_it_was() -> None:
    # A GradScaler's step cannot be traced on fake tensors; the trace that tried used to leave a
    # fake scale in the user's scaler: every later step, batchfit's trials and the user's own
    # training, then ran on fake tensors and trained nothing (the answer 10% too large).
    scaler = torch.amp.GradScaler("cpu")
    workload = scaled_cnn(scaler)
    result = find_batch_size(workload, device="cpu", memory_limit="8MiB", memory_fraction=1.0)
    assert scaler._scale is None and scaler._growth_tracker is None  # as it was: never stepped

    def fresh() -> Workload:  # a fresh copy with a scaler of its own
        return scaled_cnn(torch.amp.GradScaler("cpu"))

    assert trains(fresh, result.batch_size, "8MiB", 10) and not trains(
        fresh, result.batch_size + 1, "8MiB", 10
    )
    before = [parameter.detach().clone() for parameter in workload.model.parameters()]
    workload.run_train_step(workload.build_optimizer(), workload.host_batch(8))
    after = list(workload.model.parameters())
    assert any(not torch.equal(old, new) for old, new in zip(before, after, strict=True))


def test_a_learning_rate_schedule_the_step_moves_on_is_put_back() -> None:
    workload = build("mlp", "sgd")
    optimizer = workload.optimizer
    assert isinstance(optimizer, torch.optim.Optimizer)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)

    def train_step(model: nn.Module, opt: torch.optim.Optimizer, batch: Any) -> None:
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(batch[0]), batch[1]).backward()
        opt.step()
        scheduler.step()  # a schedule stepped with every optimizer step, as many loops do

    workload.train_step = train_step
    before = (scheduler.state_dict(), optimizer.param_groups[0]["lr"])
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        result = find_batch_size(workload, device="cpu", memory_limit="2MiB")
    # What the step warned of on fake tensors (its real optimizer did not step) is not the user's.
    assert not warned
    assert len(result.trials) >= 2  # steps ran: each would have moved the schedule on
    assert (scheduler.state_dict(), optimizer.param_groups[0]["lr"]) == before


def test_an_answer_holds_the_optimizer_state_when_the_first_fp16_steps_overflow() -> None:
    # From a fresh GradScaler the first 8 steps overflow and are skipped: Adam's state (twice the
    # weights) comes at the 9th. The first trial steps on until it comes, and the scale it reached
    # carries over, so that every later trial's steps hold that state too.
    def fresh() -> Workload:
        return overflowing_workload(1e3)

    result = find_batch_size(fresh(), device="cpu", memory_limit="2200KiB", memory_fraction=1.0)
    # 20 steps by force, as training runs them: the 8 skipped and 12 with Adam's state.
    assert trains(fresh, result.batch_size, "2200KiB", 20)
    assert not trains(fresh, result.batch_size + 1, "2200KiB", 20)


def test_an_eval_search_beside_a_grad_scaler_whose_first_steps_overflow() -> None:
    # The eval step never steps the optimizer, so the steps meant for a train step whose overflow
    # skipped it ran on into a comparison of the scaler's scale with none: ValueError at batch 2
    # (seen on an H200 with AMP; here float16 on the CPU from a fresh scaler). Eval runs its steps.
    # Its training step, which makes the optimizer's state resident, steps on while overflow skips
    # the optimizer: without Adam's state the answer was 680 where the scaler that never
    # overflowed (the same memory) answers 386.
    result = find_batch_size(
        overflowing_workload(1e3), "eval", device="cpu", memory_limit="2200KiB", memory_fraction=1.0
    )
    prompt = find_batch_size(
        overflowing_workload(1.0), "eval", device="cpu", memory_limit="2200KiB", memory_fraction=1.0
    )
    assert result.stop_reason == prompt.stop_reason == "boundary"
    assert result.batch_size == prompt.batch_size > 1
    assert all(trial.steps == result.trials[0].steps for trial in result.trials)


def test_behind_a_caching_allocator_a_search_whose_first_fp16_steps_overflow_is_replayed() -> None:
    # The first trial skipped steps for overflow: it ran other steps than the later trials, which
    # start from the scale it reached, and the replay of its requests beside theirs forecast
    # nothing (an H200's AMP search replayed no size and took 14 trials). It runs again from the
    # scale it reached: the search is the one whose scaler never overflowed.
    def search(loss_scale: float) -> batchfit.SearchResult:
        return find_on(
            ResolvedDevice(CachingCpuDevice(16 * 2**20), 0.8),
            overflowing_workload(loss_scale),
            "train",
            BatchSizes(max_batch_size=4096),
        )

    def searched(result: batchfit.SearchResult) -> list[tuple[int, str]]:
        # The search's trials; the check below its answer may confirm another size (its replay
        # plays records of another scale).
        checked = result.band.confirmed_at if result.band is not None else ()
        return [
            (trial.batch_size, trial.outcome) for trial in result.trials if trial.batch_size not in checked
        ]

    late, prompt = search(1e3), search(1.0)
    assert prompt.replays > 0 and late.replays == prompt.replays
    assert searched(late) == searched(prompt)
    assert late.batch_size == prompt.batch_size and len(searched(late)) <= 5


@pytest.mark.parametrize("per_sample", [1300, 1500, 1700])
def test_behind_a_caching_allocator_a_forecast_that_overshot_is_asked_again_near_the_boundary(
    per_sample: int,
) -> None:
    # The opening's requests (batches 2 and 4) lack the workspace: their replay overshoots the
    # boundary by 1.7-8%, and the search gallops down from the failure, from a 32nd of it (109
    # below 3,495), doubling, and at most to an eighth below it. The first size that fits there is
    # a confirming trial whose requests are recorded: the replay, asked again on them, places the
    # answer, and the next trial is the candidate after it: 6-7 trials in all (9-11 when the
    # gallop started 7 below).
    def search(tuning: Tuning = DEFAULT_TUNING) -> batchfit.SearchResult:
        return find_on(
            ResolvedDevice(CachingCpuDevice(40 * 2**20), 0.8),
            large_batch_workspace(per_sample),
            "train",
            BatchSizes(max_batch_size=8192),
            tuning=tuning,
        )

    asked_again = search()
    # The check below the answer confirms the size whose replay reserves the most above the
    # answer's (the search's trials are the others): it fits, and the answer stands.
    band = asked_again.band
    assert band is not None and band.isolated is None and band.high == asked_again.batch_size
    checked = [trial for trial in asked_again.trials if trial.batch_size in band.confirmed_at]
    assert len(checked) <= 1 and all(trial.fits for trial in checked)
    sizes = [trial.batch_size for trial in asked_again.trials if trial.batch_size not in band.confirmed_at]
    first_fit = next(i for i, trial in enumerate(asked_again.trials[3:], 3) if trial.fits)
    assert not asked_again.trials[2].fits and sizes[2] > asked_again.batch_size * 1.015  # it overshot
    galloped = sizes[2 : first_fit + 1]  # the failed forecast, the gallop's failures, the first fit
    steps = [above - below for above, below in itertools.pairwise(galloped)]
    floor = sizes[2] * 7 // 8
    assert steps[0] == round(sizes[2] * DEFAULT_TUNING.first_descent)
    assert all(later == 2 * earlier for earlier, later in itertools.pairwise(steps[:-1]))
    # the floor itself, not past it
    assert len(steps) == 1 or steps[-1] == 2 * steps[-2] or sizes[first_fit] == floor
    assert sizes[first_fit + 1 :] == [asked_again.batch_size, asked_again.batch_size + 1]
    assert len(sizes) <= 7
    last = [trial for trial in asked_again.trials if trial.batch_size not in band.confirmed_at][-1]
    assert asked_again.stop_reason == "boundary" and last.outcome == "oom"
    bisected = search(dataclasses.replace(DEFAULT_TUNING, revisions=0))  # not asked again: bisection
    assert bisected.batch_size == asked_again.batch_size
    assert len(bisected.trials) >= len(asked_again.trials) + 3


@pytest.mark.parametrize("per_sample", [1600, 3200])
def test_behind_a_caching_allocator_a_forecast_that_was_low_is_asked_again_near_the_boundary(
    per_sample: int,
) -> None:
    # Now the workspace is the small batches' (below 64 samples): the replay of 2 and 4 plays it
    # at every size and answers 6-25% low. Its answer and the candidate after it fit; the latter's
    # recorded requests, which lack the workspace, align with the opening's, and the replay asked
    # again places the answer. The line alone took 17-18 trials there.
    def search(tuning: Tuning = DEFAULT_TUNING) -> batchfit.SearchResult:
        workload = large_batch_workspace(per_sample, small=True)
        return find_on(
            ResolvedDevice(CachingCpuDevice(40 * 2**20), 0.8),
            workload,
            "train",
            BatchSizes(max_batch_size=8192),
            tuning=tuning,
        )

    asked_again = search()
    sizes = [trial.batch_size for trial in asked_again.trials]
    answer = asked_again.batch_size
    assert sizes[:2] == [2, 4] and sizes[3] == sizes[2] + 1 < answer * 0.95  # low, refuted
    assert sizes[4:] == [answer, answer + 1] and asked_again.stop_reason == "boundary"
    by_the_line = search(dataclasses.replace(DEFAULT_TUNING, revisions=0))
    assert by_the_line.batch_size == answer and len(by_the_line.trials) >= len(sizes) + 8


def test_a_lazy_module_waiting_for_its_first_batch_is_named() -> None:
    model = nn.Sequential(nn.LazyLinear(8), nn.ReLU(), nn.Linear(8, 10))
    workload = Workload(model, lambda p: torch.optim.SGD(p, lr=0.1), make_batch=classification_batch((4,)))
    named = r"^the model's 0\.weight, 0\.bias are not initialized yet \(a lazy module, such as nn\.LazyLinear"
    with pytest.raises(ConfigurationError, match=named):
        find_batch_size(workload, device="cpu", memory_limit="1MiB")
    with pytest.raises(ConfigurationError, match=named):
        batchfit.explore(workload, device="cpu", sizes=BatchSizes(max_batch_size=4))


def test_an_optimizer_that_needs_a_closure_is_stepped_with_one() -> None:
    # L-BFGS's step takes a closure that recomputes the loss (batchfit's step called step() and
    # failed), and it replaces its direction and history tensors as it goes. A trial that kept the
    # ones it started with counted them twice: "does not fit even at batch_size=1", and with the
    # trials' own list freed, 270, where the truth is 348.
    workload = lbfgs_mlp()
    before = _state(workload)
    result = find_batch_size(workload, device="cpu", memory_limit="6MiB", memory_fraction=1.0)
    _assert_identical(before, _state(workload))
    assert result.stop_reason == "boundary"
    assert trains(lbfgs_mlp, result.batch_size, "6MiB", 2)
    assert not trains(lbfgs_mlp, result.batch_size + 1, "6MiB", 2)


def test_a_sparse_gradient_is_counted() -> None:
    # The table's gradient holds one row per looked-up index: the tracker counts its indices and
    # values (it could not read a sparse tensor's storage before), and the trace, which cannot
    # size them, leaves the search to real trials.
    workload = sparse_embedding_workload()
    result = find_batch_size(workload, device="cpu", memory_limit="2MiB", memory_fraction=1.0)
    assert not result.predicted_trials
    assert trains(sparse_embedding_workload, result.batch_size, "2MiB", 2)
    assert not trains(sparse_embedding_workload, result.batch_size + 1, "2MiB", 2)


def test_a_buffer_the_forward_assigns_anew_is_freed_as_in_training() -> None:
    # The snapshot held the queue it started with beside the one each step made: find said "does
    # not fit even at batch_size=1" under 3 MiB, where 3440 trains.
    workload = queue_workload()
    queue = workload.model.queue.clone()
    result = find_batch_size(
        workload,
        device="cpu",
        memory_limit="3MiB",
        memory_fraction=1.0,
        sizes=BatchSizes(max_batch_size=4096),
    )
    assert torch.equal(workload.model.queue, queue)
    assert trains(queue_workload, result.batch_size, "3MiB", 2)
    assert not trains(queue_workload, result.batch_size + 1, "3MiB", 2)


def test_dataset_items_default_collate_cannot_batch_ask_for_a_collate_fn() -> None:
    class Tokens(torch.utils.data.Dataset[dict[str, Any]]):
        def __len__(self) -> int:
            return 20

        def __getitem__(self, index: int) -> dict[str, Any]:
            return {"input_ids": list(range(3 + index % 5)), "label": index % 2}

    workload = Workload(nn.Linear(4, 2), lambda p: torch.optim.SGD(p, lr=0.1), dataset=Tokens())
    with pytest.raises(
        ConfigurationError, match=r"^torch's default_collate could not make a batch of 2 dataset items"
    ) as raised:
        find_batch_size(workload, device="cpu", memory_limit="1MiB")
    assert "pass Workload(collate_fn=...)" in str(raised.value) and isinstance(
        raised.value.__cause__, RuntimeError
    )


@pytest.mark.parametrize(
    ("loss_fn", "found"),
    [
        (nn.CrossEntropyLoss(reduction="none"), "a tensor of shape (2,)"),
        (lambda output, target: nn.functional.cross_entropy(output, target).item(), "float"),
    ],
)
def test_a_loss_fn_that_returns_no_scalar_tensor_is_named(loss_fn: Any, found: str) -> None:
    workload = build("mlp", "sgd")
    workload.loss_fn = loss_fn
    with pytest.raises(
        ConfigurationError, match=rf"^loss_fn returned {re.escape(found)}, not a scalar loss; reduce it"
    ):
        find_batch_size(workload, device="cpu", memory_limit="8MiB")


def test_a_mapping_that_is_not_a_dict_is_a_batch() -> None:
    # Hugging Face's tokenizers and data collators return a BatchEncoding: a Mapping, not a dict,
    # which torch's pytree takes for one leaf ("returned no tensors" before). It is read as the
    # dict it holds: the same answer as the dict, passed to the model as keyword arguments.
    class Scorer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = tiny_mlp()

        def forward(self, inputs: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            return nn.functional.cross_entropy(self.body(inputs), target)

    def workload(mapping: Callable[[dict[str, torch.Tensor]], Any]) -> Workload:
        torch.manual_seed(0)
        model = Scorer()
        make = classification_batch((64,))

        def make_batch(n: int) -> Any:
            inputs, target = make(n)
            return mapping({"inputs": inputs, "target": target})

        return Workload(model, torch.optim.SGD(model.parameters(), lr=0.1), make_batch=make_batch)

    answers = [
        find_batch_size(workload(kind), device="cpu", memory_limit="2MiB").batch_size
        for kind in (dict, collections.UserDict)
    ]
    assert answers[0] == answers[1] < 512


def scripted_mlp() -> Workload:
    torch.manual_seed(0)
    model = torch.jit.script(tiny_mlp())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return Workload(
        model, optimizer, make_batch=classification_batch((64,)), loss_fn=nn.functional.cross_entropy
    )


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
@pytest.mark.parametrize("caching", [False, True], ids=["cpu", "cpu-caching"])
def test_a_scripted_model_s_out_of_memory_is_one(caching: bool) -> None:
    # TorchScript's interpreter re-raises the cap's out-of-memory, raised inside its backward, as
    # a RuntimeError with no message: the trial raised it as an error of the step. The cap's own
    # message now decides.
    limit = 2 * 2**20
    if caching:
        result = find_on(
            ResolvedDevice(CachingCpuDevice(limit), 1.0),
            scripted_mlp(),
            "train",
            BatchSizes(max_batch_size=4096),
        )
    else:
        result = find_batch_size(scripted_mlp(), device="cpu", memory_limit=limit, memory_fraction=1.0)
    failed = [trial for trial in result.trials if trial.outcome == "oom"]
    assert failed and all("out of memory" in trial.detail.lower() for trial in failed)
    if not caching:
        assert trains(scripted_mlp, result.batch_size, "2MiB", 2)
        assert not trains(scripted_mlp, result.batch_size + 1, "2MiB", 2)


def test_a_batch_of_numpy_arrays_is_named() -> None:
    workload = build("mlp", "sgd")
    workload.make_batch = lambda n: (np.zeros((n, 64), dtype=np.float32), np.zeros(n, dtype=np.int64))
    with pytest.raises(
        ConfigurationError,
        match=r"^make_batch\(2\) returned no tensors \(ndarray: convert it with torch\.from_numpy or "
        r"torch\.as_tensor\); a batch must hold tensors\.$",
    ):
        find_batch_size(workload, device="cpu", memory_limit="8MiB")


def test_a_discriminator_and_an_ema_the_step_updates_are_put_back_and_counted() -> None:
    # The fake trace used to step the discriminator's real optimizer on fake tensors: its state was
    # left fake, and from then on the user's own training no longer moved the discriminator. The
    # real trials moved the EMA copy on, and the tracker did not count either as resident.
    workload, other = adversarial()
    critic, critic_optimizer, ema = other["critic"], other["critic_optimizer"], other["ema"]
    before = {
        name: value.clone() for name, value in (*critic.state_dict().items(), *ema.state_dict().items())
    }
    assert set(map(id, workload.reached)) == {id(critic), id(critic_optimizer), id(ema)}
    result = find_batch_size(
        workload, device="cpu", memory_limit="8MiB", sizes=BatchSizes(max_batch_size=8192)
    )
    assert not result.predicted_trials  # no trace: its fakes would not be this other state
    after = {name: value for name, value in (*critic.state_dict().items(), *ema.state_dict().items())}
    assert all(
        type(value) is torch.Tensor and torch.equal(value, before[name]) for name, value in after.items()
    )
    assert len(critic_optimizer.state) == 0  # as it was: never stepped

    def trains_all(batch_size: int) -> bool:  # by force, under the budget, all it holds resident
        fresh, state = adversarial()
        optimizer = fresh.build_optimizer()
        resident = [fresh.model, optimizer, *state.values()]
        try:
            with batchfit.cap_memory(result.budget_bytes, resident=resident):
                for _ in range(2):
                    fresh.run_train_step(optimizer, fresh.host_batch(batch_size))
        except torch.OutOfMemoryError:
            return False
        return True

    assert trains_all(result.batch_size) and not trains_all(result.batch_size + 1)
    critic_weights = critic[0].weight.detach().clone()
    workload.run_train_step(workload.build_optimizer(), workload.host_batch(8))
    assert not torch.equal(critic[0].weight, critic_weights)  # the user's training moves it again


@pytest.mark.parametrize(("cap_mib", "fragmented"), [(230, True), (64, False)])
def test_the_summary_says_when_the_next_size_failed_with_room_in_the_allocator_s_cache(
    cap_mib: int, fragmented: bool
) -> None:
    # Behind the modelled caching allocator the cnn's next size asks for a 20 MiB segment: under
    # 230 MiB its cache holds more than that free, in pieces; under 64 MiB it does not.
    workload = build_example("cnn", "cpu")
    result = find_on(
        ResolvedDevice(CachingCpuDevice(cap_mib << 20), 1.0),
        workload,
        "train",
        BatchSizes(max_batch_size=1024),
    )
    said = re.search(
        r"Batch (\d+) ran out of memory asking for 20\.00 MiB while the allocator held ([\d.]+) MiB reserved "
        r"but unallocated: room, not in one piece \(fragmentation\)\. Expandable segments may fit more",
        result.summary(),
    )
    assert (said is not None) == fragmented, result.summary()
    if said is not None:
        assert int(said[1]) == result.batch_size + 1 and float(said[2]) > 20

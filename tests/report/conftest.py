"""Saved results for the report tests, from real runs on the CPU (mostly the built-in mlp example;
find on a device capped at 48 MiB, so each search hits a real oom), in the JSON envelope every
command writes and read back from JSON. Session-scoped: each command runs once for all the report tests."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import Dataset

import batchfit
from batchfit import BatchSizes, Timing, find_batch_size
from batchfit.advice.advise import Checklist, advise
from batchfit.analysis.analyze import analyze
from batchfit.comparison.compare import compare
from batchfit.data_check.check_data import check_data
from batchfit.exploration.explore import explore, with_goodput
from batchfit.exploration.explore_result import ExploreResult
from batchfit.policy.explore.loader_settings import LoaderSearch
from batchfit.policy.noise.noise_scale import NoiseScale
from batchfit.policy.plan.plan import plan
from batchfit.policy.plan.plan_options import Baseline
from batchfit.prediction.predict import Recorder, predict_on
from batchfit.prediction.prediction import Targets
from batchfit.report import SavedResult, read_result, saved_result
from batchfit.runtime.devices.caching_device import CachingCpuDevice
from batchfit.runtime.workloads.examples import build_example

CREATED_AT = "2025-01-01T00:00:00+00:00"


def as_saved(document: dict[str, Any]) -> dict[str, Any]:
    """``document`` as read back from its file."""
    return dict(json.loads(json.dumps(document)))


def written(command: str, results: list[Any], workload: str | None = "mlp", **extras: Any) -> dict[str, Any]:
    """What ``batchfit COMMAND --format json`` writes around ``results``, read back from JSON."""
    dicts = [result.to_dict() for result in results]
    envelope = {
        "command": command,
        "versions": dicts[0]["versions"],
        "workload": workload,
        "created_at": CREATED_AT,
        **extras,
        "results": dicts,
    }
    return as_saved(envelope)


@pytest.fixture(scope="session")
def find_document() -> dict[str, Any]:
    """What ``batchfit find --format json`` writes, for train and eval; each hits a real oom."""
    results = [
        find_batch_size(
            build_example("mlp", "cpu"),
            mode,
            device="cpu",
            memory_limit="48MiB",
            sizes=BatchSizes(max_batch_size=1024),
        )
        for mode in ("train", "eval")
    ]
    return written("find", results)


@pytest.fixture(scope="session")
def find_result(find_document: dict[str, Any]) -> SavedResult:
    return saved_result(find_document, "find.json")


@pytest.fixture(scope="session")
def explored() -> ExploreResult:
    """A one-second exploration of the mlp on the CPU."""
    return explore(
        build_example("mlp", "cpu"),
        device="cpu",
        sizes=BatchSizes(max_batch_size=64),
        timing=Timing(windows=2, steps_per_window=2, time_budget_seconds=1),
    )


@pytest.fixture(scope="session")
def explore_result(explored: ExploreResult) -> SavedResult:
    """What ``batchfit explore --format json`` writes for a one-second exploration."""
    return saved_result(written("explore", [explored], tolerance=0.03), "explore.json")


#: A measured noise scale with its 90% interval, for the goodput page.
NOISE_SCALE = NoiseScale(24.0, 12.0, 48.0, 10, 8, 64, 1.0, 24.0)


@pytest.fixture(scope="session")
def explore_goodput_result(explored: ExploreResult) -> SavedResult:
    """What ``batchfit explore --format json`` writes for that exploration given a noise scale."""
    result = with_goodput(explored, NOISE_SCALE)
    return saved_result(written("explore", [result], tolerance=0.03), "explore-goodput.json")


@pytest.fixture(scope="session")
def explore_one_point_result(explore_result: SavedResult) -> SavedResult:
    """An exploration cut short after its first size: one estimate, one recommendation."""
    document = dict(explore_result.document)
    first = document["points"][0]
    document["points"] = [first]
    size = first["batch_size"]
    recommended = {
        **document["history"][0],
        **{"batch_size": size, "best_batch_size": size, "base_batch_size": size, "speedup": 1.0},
    }
    document["history"] = [recommended]
    document["recommendation"] = recommended
    return SavedResult("explore", document, "explore-one-point.json")


@pytest.fixture(scope="session")
def plan_result() -> SavedResult:
    """What ``batchfit plan --format json`` writes for 1024 samples over 8 ranks."""
    result = plan(1024, Baseline(0.1, 256), world_size=8, max_micro_batch_size=48)
    return saved_result(written("plan", [result], workload=None), "plan.json")


@pytest.fixture(scope="session")
def analyze_result() -> SavedResult:
    """What ``batchfit analyze --output X.json`` writes, at two fractions of a 64 MiB CPU."""
    analysis = analyze(build_example("mlp", "cpu"), [0.6, 0.8], device="cpu", memory_limit="64MiB")
    return saved_result(written("analyze", [analysis]), "analyze.json")


def blocks_workload() -> batchfit.Workload:
    """A small MLP of four repeated blocks, so that checkpointing applies."""
    torch.manual_seed(0)
    blocks = (nn.Sequential(nn.Linear(256, 256), nn.ReLU()) for _ in range(4))
    model = nn.Sequential(*blocks, nn.Linear(256, 4))
    return batchfit.Workload(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        make_batch=lambda n: (torch.randn(n, 256), torch.randint(0, 4, (n,))),
        loss_fn=nn.functional.cross_entropy,
        name="blocks",
    )


@pytest.fixture(scope="session")
def compare_result() -> SavedResult:
    """What ``batchfit compare --format json`` writes for four techniques on an 8 MiB CPU."""
    comparison = compare(
        blocks_workload(),
        ["baseline", "amp", "checkpointing", "accumulation"],
        device="cpu",
        memory_limit="8MiB",
        sizes=BatchSizes(max_batch_size=4096, global_batch_size=8192),
        timing=Timing(windows=1, time_budget_seconds=0, time_slow=True),
    )
    return saved_result(written("compare", [comparison], "blocks"), "compare.json")


class SleepyItems(Dataset[tuple[torch.Tensor, int]]):
    """Each item sleeps 2 ms, as a read from slow storage: 32 items wait longer than a step."""

    def __len__(self) -> int:
        return 512

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        time.sleep(0.002)
        return torch.full((32,), float(index % 7)), index % 4


def slow_step(model: nn.Module, optimizer: Any, batch: Any) -> None:
    """A real step, then 30 ms of the device's share of it."""
    inputs, target = batch
    optimizer.zero_grad(set_to_none=True)
    nn.functional.cross_entropy(model(inputs), target).backward()
    optimizer.step()
    time.sleep(0.03)


@pytest.fixture(scope="session")
def check_data_result() -> SavedResult:
    """What ``batchfit check-data --format json`` writes for a loader that holds training back."""
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
    workload = batchfit.Workload(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        dataset=SleepyItems(),
        train_step=slow_step,
        name="sleepy",
    )
    result = check_data(
        workload, 32, device="cpu", search=LoaderSearch(max_num_workers=1, window_seconds=0.3)
    )
    return saved_result(written("check-data", [result], "sleepy"), "check-data.json")


@pytest.fixture(scope="session")
def advise_result() -> SavedResult:
    """What ``batchfit advise --format json`` writes: every step but check-data (no dataset)."""
    result = advise(
        build_example("mlp", "cpu"),
        device="cpu",
        memory_limit="48MiB",
        checklist=Checklist(techniques=("baseline", "amp")),
        baseline=Baseline(0.1, 256),
        timing=Timing(time_budget_seconds=15, time_slow=True),
    )
    context = "--example mlp --device cpu --memory-limit 48MiB"
    return saved_result(written("advise", [result], context=context), "advise.json")


@pytest.fixture(scope="session")
def noise_scale_result() -> SavedResult:
    """What ``batchfit noise-scale --format json`` writes: 8 training steps of a small MLP learning
    which of 4 inputs is largest, each step on fresh samples, batch 64 against micro-batches of 16."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    workload = batchfit.Workload(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        make_batch=largest_of_four,
        loss_fn=nn.functional.cross_entropy,
        name="largest-of-four",
    )
    sampling = batchfit.Sampling(batch_size=64, micro_batch_size=16, steps=8)
    result = batchfit.noise_scale(workload, sampling=sampling, device="cpu")
    return saved_result(written("noise-scale", [result], "largest-of-four"), "noise-scale.json")


def largest_of_four(samples: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Fresh inputs (the measurement seeds torch's RNG per step), labelled by their largest of the
    first four features: a signal the noise does not hide."""
    inputs = torch.randn(samples, 16)
    return inputs, inputs[:, :4].argmax(dim=1)


#: The results file of bench/noise_prediction.py that docs/goodput.md shows.
NOISE_PREDICTION = Path(__file__).resolve().parents[2] / "bench/data/cpu-2026-11-26/noise-prediction-cpu.json"


@pytest.fixture(scope="session")
def noise_prediction_result() -> SavedResult:
    """The committed results file of the noise scale's prediction, as ``batchfit report`` reads it."""
    return read_result(NOISE_PREDICTION)


@pytest.fixture(scope="session")
def predict_result() -> SavedResult:
    """What ``batchfit predict --format json`` writes, recorded on the CPU with CUDA's allocator
    modelled under 24 MiB (the cnn: its batch 8 fails there) and predicted at 16, 48 and 64 MiB."""
    targets = Targets("16MiB,48MiB,64MiB", context=False)
    prediction = predict_on(
        Recorder(CachingCpuDevice(24 * 2**20)), build_example("cnn"), targets, ["train", "eval"]
    )
    return saved_result(written("predict", [prediction], "cnn"), "predict.json")

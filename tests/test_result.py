"""Every result a public verb returns follows one protocol (``batchfit.Result``): ``to_dict`` carries
the command that made it and the versions, and round-trips through JSON as ``to_json`` writes it;
``summary`` is one paragraph and ``table`` the full text. Real instances, from tiny runs on the CPU."""

from __future__ import annotations

import inspect
import json
import platform
import typing
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

import batchfit
from batchfit import Advice, Baseline, BatchSizes, Result, Sampling, Timing
from batchfit.analysis.apply_autobatch import analyze_config
from batchfit.policy.explore.loader_settings import LoaderSearch
from batchfit.prediction.predict import Recorder, predict_on
from batchfit.prediction.prediction import Targets
from batchfit.runtime.devices.caching_device import CachingCpuDevice
from batchfit.runtime.workloads.examples import build_example

CAPPED = {"device": "cpu", "memory_limit": "48MiB"}


def mlp() -> batchfit.Workload:
    return build_example("mlp", "cpu")


def with_data() -> batchfit.Workload:
    model = nn.Sequential(nn.Linear(8, 4))
    data = TensorDataset(torch.randn(256, 8), torch.randint(0, 4, (256,)))
    return batchfit.Workload(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        dataset=data,
        loss_fn=nn.functional.cross_entropy,
        name="data",
    )


BUILDERS: dict[str, Any] = {
    "find": lambda: batchfit.find_batch_size(mlp(), **CAPPED, sizes=BatchSizes(max_batch_size=64)),
    "explore": lambda: batchfit.explore(
        mlp(),
        device="cpu",
        sizes=BatchSizes(max_batch_size=16),
        timing=Timing(windows=2, steps_per_window=1, time_budget_seconds=0.5),
    ),
    "compare": lambda: batchfit.compare(
        mlp(),
        ["baseline"],
        **CAPPED,
        sizes=BatchSizes(max_batch_size=64),
        timing=Timing(windows=1, time_budget_seconds=0),
    ),
    "check-data": lambda: batchfit.check_data(
        with_data(), 32, device="cpu", search=LoaderSearch(max_num_workers=0, window_seconds=0.1)
    ),
    "advise": lambda: Advice(
        None,
        None,
        None,
        None,
        None,
        batchfit.plan(512, Baseline(0.1, 256), max_micro_batch_size=64),
        512,
        (),
        (),
        (),
        ("find: asked",),
        0.1,
    ),
    "analyze": lambda: batchfit.analyze(mlp(), [0.8], ["train"], **CAPPED),
    "check": lambda: batchfit.check(mlp(), 8, **CAPPED),
    "predict": lambda: predict_on(
        Recorder(CachingCpuDevice(24 * 2**20)),
        build_example("cnn"),
        Targets("48MiB", context=False),
        ["train"],
    ),
    "noise-scale": lambda: batchfit.noise_scale(
        mlp(), sampling=Sampling(batch_size=16, micro_batch_size=8, steps=2), device="cpu"
    ),
    "plan": lambda: batchfit.plan(1024, Baseline(0.1, 256), world_size=8, max_micro_batch_size=48),
}


@pytest.fixture(scope="module")
def results() -> dict[str, Result]:
    return {command: build() for command, build in BUILDERS.items()}


#: The public verbs, and the config's ``analyze_config``, each by the result type it returns
#: (``apply_autobatch``: a list of them).
VERBS = ("find_batch_size", "explore", "compare", "check_data", "advise", "analyze")
VERBS += ("check", "noise_scale", "plan", "predict", "apply_autobatch")


def test_every_public_verb_returns_a_result_tested_here() -> None:
    returned = set()
    for verb in [*(getattr(batchfit, name) for name in VERBS), analyze_config]:
        kind = typing.get_type_hints(verb)["return"]
        returned.add(typing.get_args(kind)[0] if typing.get_origin(kind) is list else kind)
    assert {kind.command for kind in returned} == set(BUILDERS)
    public = {getattr(batchfit, name) for name in batchfit.__all__}
    assert returned <= public and all(inspect.isclass(kind) for kind in returned)


@pytest.mark.parametrize("command", sorted(BUILDERS))
def test_each_result_follows_the_protocol(results: dict[str, Result], command: str) -> None:
    result = results[command]
    assert isinstance(result, Result) and type(result).command == command
    document = result.to_dict()
    assert document["command"] == command
    assert document["versions"] == {
        "batchfit": batchfit.__version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
    }
    assert json.loads(result.to_json()) == json.loads(json.dumps(document))  # the same, as JSON gives it
    assert json.loads(json.dumps(document)) == document  # nothing JSON changes (no tuples, no int keys)
    summary = result.summary()
    assert summary and "\n\n" not in summary.strip()  # one paragraph
    assert result.table().strip()


def test_the_versions_need_no_torch_import() -> None:
    # The policies (Plan) record them without importing torch: batchfit.result reaches no torch.
    source = inspect.getsource(batchfit.result)
    assert "import torch" not in source and "from torch" not in source

"""The report's pages for analyze, compare, check-data and advise, rendered from real results on the
capped CPU: one plot per part, and every number in the plots' labels is the result's."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import torch
from test_report import Page
from torch import nn
from torch.utils.data import Dataset

import batchfit
from batchfit.advise import advise
from batchfit.analyze import analyze
from batchfit.check_data import check_data
from batchfit.compare import compare
from batchfit.policy.advice import Change
from batchfit.policy.loader_settings import LoaderSetting
from batchfit.report import SavedResult, recognise, render_report
from batchfit.runtime.examples import build_example


def saved(document: dict[str, Any]) -> dict[str, Any]:
    """As the CLI writes it: what ran beside the result, read back from JSON."""
    stamped = {
        **document,
        "workload": "mlp",
        "batchfit_version": batchfit.__version__,
        "torch_version": torch.__version__,
        "created_at": "2025-01-01T00:00:00+00:00",
    }
    return dict(json.loads(json.dumps(stamped)))


def only_section(document: dict[str, Any], kind: str) -> dict[str, Any]:
    assert recognise(document) == kind
    text = render_report([SavedResult(recognise(document), document, f"{kind}.json")])
    assert "http://" not in text and "https://" not in text
    [section] = Page(text).sections
    assert section["kind"] == f"result {kind}"
    assert section["what_ran"]["command"] == f"batchfit {kind}"
    return section


@pytest.fixture(scope="module")
def analyze_document() -> dict[str, Any]:
    analysis = analyze(build_example("mlp", "cpu"), [0.6, 0.8], device="cpu", memory_limit="64MiB")
    return saved(analysis.to_dict())


def test_analyze_page_plots_batch_size_by_fraction_per_mode(analyze_document: dict[str, Any]) -> None:
    section = only_section(analyze_document, "analyze")
    assert section["svgs"] == 1
    assert section["what_ran"]["device"] == "cpu (capped at 64.00 MiB)"
    rows = analyze_document["rows"]
    assert {(row["mode"], row["memory_fraction"]) for row in rows} == {
        (mode, fraction) for mode in ("train", "eval") for fraction in (0.6, 0.8)
    }
    texts = section["texts"]
    for row in rows:
        assert str(row["batch_size"]) in texts  # each point labelled with its batch
    assert {"train", "eval", "0.6", "0.8"} <= set(texts)


def times(ratio: float | None) -> str:
    return "" if ratio is None else f" ({ratio:.2f}x)"


def blocks_workload() -> batchfit.Workload:
    """Four repeated blocks (for checkpointing) of a small MLP."""
    torch.manual_seed(0)
    model = nn.Sequential(
        *(nn.Sequential(nn.Linear(256, 256), nn.ReLU()) for _ in range(4)), nn.Linear(256, 4)
    )
    return batchfit.Workload(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        make_batch=lambda n: (torch.randn(n, 256), torch.randint(0, 4, (n,))),
        loss_fn=nn.functional.cross_entropy,
    )


@pytest.fixture(scope="module")
def compare_document() -> dict[str, Any]:
    comparison = compare(
        blocks_workload(),
        ["baseline", "amp", "checkpointing", "accumulation"],
        device="cpu",
        memory_limit="16MiB",
        global_batch_size=4096,
        windows=1,
        explore_seconds=0,
    )
    return saved(comparison.to_dict())


def test_compare_page_plots_each_technique_against_the_baseline(compare_document: dict[str, Any]) -> None:
    section = only_section(compare_document, "compare")
    assert section["svgs"] == 1  # largest batch and throughput side by side
    texts = section["texts"]
    rows = compare_document["rows"]
    assert [row["technique"] for row in rows] == ["baseline", "amp", "checkpointing", "accumulation"]
    for row in rows:
        assert row["technique"] in texts
        assert row["applied"]
        batch = (">=" if row["at_max_batch_size"] else "") + str(row["batch_size"])
        batch += f"x{row['accumulation_steps']}" if row["accumulation_steps"] else ""
        assert batch + times(row["batch_ratio"]) in texts
        assert f"{row['samples_per_second']:.1f}" + times(row["throughput_ratio"]) in texts
    assert rows[0]["batch_ratio"] == rows[0]["throughput_ratio"] == 1.0
    assert rows[3]["accumulation_steps"] and rows[3]["batch_ratio"] is None  # a micro-batch: no ratio
    assert section["lists"]["compare-notes"] == [f"{row['technique']}: {row['note']}" for row in rows]


def test_a_technique_that_cannot_apply_says_why_on_the_page() -> None:
    comparison = compare(
        build_example("mlp", "cpu"),
        ["baseline", "checkpointing"],
        device="cpu",
        memory_limit="48MiB",
        windows=1,
        explore_seconds=0,
    )
    section = only_section(saved(comparison.to_dict()), "compare")
    refused = comparison.rows[1]
    assert not refused.applied
    assert "cannot apply (see below)" in section["texts"] and "not measured" in section["texts"]
    assert f"checkpointing: cannot apply: {refused.note}" in section["lists"]["compare-notes"]


class SleepyItems(Dataset[tuple[torch.Tensor, int]]):
    """Each item sleeps 2 ms, as a read from slow storage: 32 items wait longer than a step."""

    def __len__(self) -> int:
        return 512

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        time.sleep(0.002)
        return torch.full((32,), float(index % 7)), index % 4


def slow_step(model: nn.Module, optimizer: Any, batch: Any) -> None:
    inputs, target = batch
    optimizer.zero_grad(set_to_none=True)
    nn.functional.cross_entropy(model(inputs), target).backward()
    optimizer.step()
    time.sleep(0.03)  # the device's share of the step


@pytest.fixture(scope="module")
def check_document() -> dict[str, Any]:
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
    workload = batchfit.Workload(
        model, torch.optim.SGD(model.parameters(), lr=0.1), dataset=SleepyItems(), train_step=slow_step
    )
    result = check_data(workload, 32, device="cpu", max_num_workers=1, window_seconds=0.3)
    return saved(result.to_dict())


def test_check_data_page_plots_each_settings_wait_and_speed(check_document: dict[str, Any]) -> None:
    section = only_section(check_document, "check-data")
    assert section["svgs"] == 1
    texts = section["texts"]
    settings = check_document["settings"]
    assert len(settings) >= 2 and check_document["recommendation"] is not None  # the loader waited
    chosen = LoaderSetting(**check_document["recommendation"]["setting"])
    for index, row in enumerate(settings):
        setting = LoaderSetting(**{key: row[key] for key in LoaderSetting.__dataclass_fields__})
        marks = (["current"] if index == 0 else []) + (["recommended"] if setting == chosen else [])
        assert setting.describe() + (f" ({', '.join(marks)})" if marks else "") in texts
        assert f"{row['data_wait_share']:.1%} wait" in texts
        assert f"{row['samples_per_second']:.1f}" in texts
    assert f"loader alone {check_document['loader_samples_per_second']:.1f}" in texts
    assert f"step alone {check_document['step_samples_per_second']:.1f}" in texts
    assert f"samples/s training at batch_size={check_document['batch_size']}" in texts
    assert section["lists"]["check-data-notes"][0] == check_document["summary"]


@pytest.fixture(scope="module")
def advise_document() -> dict[str, Any]:
    result = advise(
        build_example("mlp", "cpu"),
        device="cpu",
        memory_limit="48MiB",
        explore_seconds=0.5,
        techniques=["baseline", "amp"],
        base_learning_rate=0.1,
        base_batch_size=256,
    )
    return saved({**result.to_dict(), "context": "--example mlp --device cpu --memory-limit 48MiB"})


def test_advise_page_holds_the_changes_and_each_steps_plots(advise_document: dict[str, Any]) -> None:
    section = only_section(advise_document, "advise")
    assert advise_document["data"] is None  # the example has no dataset: check-data is skipped
    assert section["svgs"] == 4  # find (train and eval), explore, compare, plan
    lines = [Change(**change).line(advise_document["context"]) for change in advise_document["changes"]]
    assert section["lists"]["advise-changes"] == (lines or ["nothing measured is worth it"])
    assert section["lists"]["advise-skipped"] == advise_document["skipped"]
    texts = section["texts"]
    train, evaluation = advise_document["train"], advise_document["eval"]
    assert f"train: batch_size={train['batch_size']}" in texts
    assert f"eval: batch_size={evaluation['batch_size']}" in texts
    recommended = advise_document["exploration"]["recommendation"]["batch_size"]
    assert f"recommended batch_size={recommended}" in texts
    assert f"learning_rate={advise_document['plan']['learning_rate']:g}" in texts
    assert section["what_ran"]["device"] == "cpu (capped at 48.00 MiB)"

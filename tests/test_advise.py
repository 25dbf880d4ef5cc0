"""advise on real models: every step's result is the step's own, the changes are ranked by what
was measured, a slow loader is found, and each step can be skipped."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import data_workloads
import pytest

from batchfit import (
    Baseline,
    Checklist,
    ConfigurationError,
    Timing,
    advise,
    find_batch_size,
)
from batchfit.runtime.workloads.examples import build_example

TESTS = Path(__file__).resolve().parent


def test_advise_runs_the_checklist_and_ranks_what_it_measured() -> None:
    heard: list[tuple[str, int, str]] = []
    result = advise(
        build_example("cnn", "cpu"),
        device="cpu",
        memory_limit="64MiB",
        checklist=Checklist(techniques=("amp", "checkpointing")),
        baseline=Baseline(0.1, 256),
        on_progress=lambda event: (
            heard.append((event.label, event.trial.batch_size, event.trial.outcome)) if event.trial else None
        ),
        timing=Timing(time_budget_seconds=2),
    )
    assert result.train is not None and result.comparison is not None
    for label, search in (("train", result.train), ("eval", result.eval)):  # each trial heard, in order
        assert search is not None
        assert [(size, outcome) for name, size, outcome in heard if name == label] == [
            (trial.batch_size, trial.outcome) for trial in search.trials
        ]
    assert {label for label, _, _ in heard} == {"train", "eval", "baseline", "amp", "checkpointing"}
    alone = find_batch_size(build_example("cnn", "cpu"), device="cpu", memory_limit="64MiB")
    assert result.train is not None and result.train.batch_size == alone.batch_size
    assert result.eval is not None and result.eval.mode == "eval"
    assert result.exploration is not None and result.exploration.max_batch_size == alone.batch_size
    assert result.batch_size == result.exploration.recommendation.batch_size
    assert result.comparison is not None
    rows = {row.technique: row for row in result.comparison.rows}
    amp = [change for change in result.changes + result.memory_only if change.what.startswith("amp ")]
    assert len(amp) == 1 and amp[0].batch_gain == rows["amp"].batch_ratio > 1.5  # bfloat16 on this CNN
    speeds = [change.speedup or 1.0 for change in result.changes]
    assert speeds == sorted(speeds, reverse=True)
    assert result.plan is not None and result.plan.global_batch_size == result.batch_size
    assert result.skipped == ("check-data: the workload has no dataset and no loader was given",)
    report = result.report("--example cnn")
    assert f"train {alone.batch_size}" in report and "(evidence: batchfit find --example cnn)" in report
    assert json.loads(result.to_json())["batch_size"] == result.batch_size


def test_a_slow_loader_is_the_first_thing_to_change() -> None:
    steps = Checklist(skip=("find", "explore", "compare"), batch_size=32)
    result = advise(data_workloads.sleepy(), device="cpu", checklist=steps)
    assert result.train is None and result.comparison is None
    assert result.data is not None and result.data.bottleneck
    first = result.changes[0]
    assert first.what.startswith("load data with num_workers=") and first.speedup is not None
    assert first.speedup > 1.5 and first.evidence == "batchfit check-data --batch-size 32"
    assert "find: asked" in result.skipped


def test_bad_steps_and_half_a_plan_are_refused() -> None:
    with pytest.raises(ConfigurationError, match=r"^skip \['tune'\]: the steps are find, explore, compare"):
        Checklist(skip=("tune",))
    half = subprocess.run(
        [sys.executable, "-m", "batchfit", "advise", "--example", "mlp", "--base-learning-rate", "0.1"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert half.returncode == 1 and half.stderr.startswith(
        "batchfit: error: plan needs both --base-learning-rate and --base-batch-size"
    ), half.stderr


def test_the_cli_prints_the_advice_and_skips_what_it_is_told() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "batchfit",
            "advise",
            "--example",
            "mlp",
            "--device",
            "cpu",
            "--memory-limit",
            "64MiB",
            "--skip",
            "explore,compare",
            "--format",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert document["train"]["batch_size"] == document["batch_size"] > 0
    assert document["exploration"] is None and document["comparison"] is None
    assert document["skipped"][:2] == ["explore: asked", "compare: asked"]
    assert "batchfit: advise: find..." in done.stderr
    trials = [line.split() for line in done.stderr.splitlines() if " batch_size=" in line]
    answer = f"batch_size={document['train']['batch_size']}"
    assert ["batchfit:", "train", answer, "ok"] in [words[:4] for words in trials]  # find's own lines
    assert any(words[1] == "eval" for words in trials)
    bad = subprocess.run(
        [sys.executable, "-m", "batchfit", "advise", "--example", "mlp", "--skip", "tune"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert bad.returncode == 1
    assert bad.stderr.startswith("batchfit: error: --skip 'tune': the steps are find, explore, compare")

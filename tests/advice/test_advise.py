"""advise on real models: every step's result is the step's own, the changes are ranked by what
was measured, a slow loader is found, and each step can be skipped."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import data_workloads
import pytest
import torch
from tiny_workloads import blocks_cnn, build

from batchfit import (
    Advice,
    Baseline,
    ConfigurationError,
    ExploreResult,
    Timing,
    advise,
    find_batch_size,
    plan,
)
from batchfit.advice.advise import Checklist
from batchfit.policy.explore.advice import Change, costly, counted_speedup, noisy, rank
from batchfit.policy.explore.choose import Recommendation
from batchfit.policy.explore.settling import Unsettled
from batchfit.policy.explore.throughput import Point
from batchfit.policy.plan.plan_options import Scaling

TESTS = Path(__file__).resolve().parents[1]
LINEAR = "SGD scales the learning rate with the batch, after a warm-up (Goyal et al., 2017)"


def test_advise_runs_the_checklist_and_ranks_what_it_measured() -> None:
    heard: list[tuple[str, int, str]] = []
    # The example cnn's shape, small: its amp row trains under autocast, about 20x slower on a CPU
    # without bfloat16 kernels.
    result = advise(
        blocks_cnn(),
        device="cpu",
        memory_limit="4MiB",
        checklist=Checklist(techniques=("amp", "checkpointing")),
        baseline=Baseline(0.1, 256),
        on_progress=lambda event: (
            heard.append((event.label, event.trial.batch_size, event.trial.outcome)) if event.trial else None
        ),
        timing=Timing(time_budget_seconds=30, time_slow=True),
    )
    assert result.train is not None and result.comparison is not None
    for label, search in (("train", result.train), ("eval", result.eval)):  # each trial heard, in order
        assert search is not None
        assert [(size, outcome) for name, size, outcome in heard if name == label] == [
            (trial.batch_size, trial.outcome) for trial in search.trials
        ]
    assert {label for label, _, _ in heard} == {"train", "eval", "baseline", "amp", "checkpointing"}
    alone = find_batch_size(blocks_cnn(), device="cpu", memory_limit="4MiB")
    assert result.train is not None and result.train.batch_size == alone.batch_size
    assert result.eval is not None and result.eval.mode == "eval"
    assert result.exploration is not None and result.exploration.max_batch_size == alone.batch_size
    assert result.batch_size == result.exploration.recommendation.batch_size
    assert result.comparison is not None
    rows = {row.technique: row for row in result.comparison.rows}
    amp = [change for change in result.changes + result.memory_only if change.what.startswith("amp ")]
    assert len(amp) == 1 and amp[0].batch_gain == rows["amp"].batch_ratio > 1.5  # bfloat16 on this CNN
    # Ranked by speed-up, one within noise counting as none (1.0), then by batch gain: on a loaded
    # CPU, or one without bfloat16 kernels, amp's slower steps can read within noise.
    ranked = [(counted_speedup(change) or 1.0, change.batch_gain or 1.0) for change in result.changes]
    assert ranked == sorted(ranked, reverse=True)
    assert result.plan is not None and result.plan.global_batch_size == result.batch_size
    # The cnn trains with SGD: the linear rule, and the plan says why.
    assert (result.plan.optimizer, result.plan.scaling_rule) == ("SGD", "linear")
    assert result.plan.scaling_reason.startswith("linear: SGD scales the learning rate with the batch")
    assert result.skipped == ("check-data: the workload has no dataset and no loader was given",)
    report = result.table("--workload tiny_workloads:blocks_cnn")
    assert f"train {alone.batch_size}" in report
    assert "(evidence: batchfit find --workload tiny_workloads:blocks_cnn)" in report
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


def test_the_plan_scales_an_adam_workload_s_learning_rate_by_the_square_root_rule() -> None:
    """The optimizer's class name picks the rule: 0.001 tuned at 256 is 0.002 at 1024 with Adam (the
    square-root rule), where the linear rule would give 0.004."""
    only_plan = Checklist(skip=("find", "explore", "compare", "check-data"), batch_size=1024)
    result = advise(build("mlp", "adam"), device="cpu", checklist=only_plan, baseline=Baseline(0.001, 256))
    assert result.plan is not None and result.plan.optimizer == "Adam"
    assert (result.plan.scaling_rule, result.plan.learning_rate) == ("sqrt", pytest.approx(0.002))
    assert (
        "  scaling_rule sqrt: Adam-family optimizers scale the learning rate with the square root of the "
        in (result.table())
    )
    factory, without = build("mlp"), build("mlp")
    factory.optimizer = lambda parameters: torch.optim.AdamW(parameters, lr=3e-4)
    without.optimizer = None
    assert (factory.optimizer_name(), without.optimizer_name()) == ("AdamW", None)


def test_a_noise_scale_adds_goodput_to_explore_and_the_payoff_to_the_plan() -> None:
    steps = Checklist(skip=("compare", "check-data"), noise_scale=64.0)
    result = advise(
        build("mlp", "sgd"),
        device="cpu",
        memory_limit=1_600_000,
        checklist=steps,
        baseline=Baseline(0.1, 16),
        timing=Timing(windows=2, steps_per_window=1, time_budget_seconds=10),
    )
    assert result.exploration is not None and result.exploration.goodput is not None
    assert result.exploration.goodput.noise_scale == 64.0 and result.plan is not None
    assert result.plan.payoff is not None and result.plan.payoff.noise_scale == 64.0
    text = result.table().splitlines()
    start = text.index("to a target, at the noise scale given (goodput):")
    goodput = result.exploration.goodput.lines()
    assert text[start + 1 : start + 1 + len(goodput)] == [f"  {line}" for line in goodput]
    assert any(line.startswith("  noise_scale 64: from base_batch_size 16") for line in text)
    assert json.loads(result.to_json())["exploration"]["goodput"]["time_optimal"] == (
        result.exploration.goodput.time_optimal
    )


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
    assert half.returncode == 2 and half.stderr.startswith(
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
    (document,) = json.loads(done.stdout)["results"]
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
    assert bad.returncode == 2
    assert bad.stderr.startswith("batchfit: error: --skip 'tune': the steps are find, explore, compare")


def test_the_report_keeps_noise_and_an_unsettled_explore_apart_from_the_answers() -> None:
    """A change whose speed-up is within noise is listed apart, not ranked; an exploration under
    the confidence floor is a leaning, with what would settle it, and the plan at it says so."""
    leaning = Recommendation(140, 140, 140, 1.0, 0)
    doubt = Unsettled(0, 50, 140, (140,), 40.2, 45.7, "the rest of explore's plan")
    exploration = ExploreResult(
        (Point(140, (96.0, 100.0, 104.0), (0, 0, 0)),),
        leaning,
        (leaning,),
        140,
        "samples/s",
        "time_budget",
        5.5,
        "cpu",
        doubt,
    )
    amp = Change("amp (autocast bfloat16)", 1.9, 1.79, "batchfit compare --techniques amp", False, 1.7, 2.1)
    checkpointing = Change(
        "checkpointing (3 blocks)", 1.05, 1.02, "batchfit compare --techniques checkpointing", False, 0.9, 1.2
    )
    advice = Advice(
        None,
        None,
        exploration,
        None,
        None,
        plan(140, Baseline(0.1, 256), max_micro_batch_size=140, scaling=Scaling(optimizer="SGD")),
        140,
        rank([amp, checkpointing]),
        costly([amp, checkpointing]),
        noisy([amp, checkpointing]),
        (),
        60.0,
    )
    assert advice.table("--example cnn").splitlines() == [
        (
            "explore settled no batch size: it leans to 140 (100.0 samples/s) at confidence 0, below 50: the "
            "measurements do not yet tell the sizes apart; measured 140; about 41 s more of timing "
            "would settle it (time_budget_seconds about 46): the rest of explore's plan "
            "(evidence: batchfit explore --example cnn)"
        ),
        "what to change, by measured gain:",
        (
            "  1. amp (autocast bfloat16): 1.90x the throughput [1.70, 2.10], 1.79x the largest batch "
            "(evidence: batchfit compare --techniques amp --example cnn)"
        ),
        "within noise, not ranked (the speed-up's 90% interval includes 1.00x):",
        (
            "  - checkpointing (3 blocks): 1.05x the throughput [0.90, 1.20] (within noise), 1.02x the "
            "largest batch (evidence: batchfit compare --techniques checkpointing --example cnn)"
        ),
        "plan (at 140, explore's leaning, not settled):",
        "  global_batch_size 140 = micro_batch_size 140 x accumulation_steps 1 x world_size 1",
        "  learning_rate 0.0546875 = base_learning_rate 0.1 x 140 / 256 (linear rule)",
        f"  scaling_rule linear: {LINEAR}",
        "  warmup_steps 0 (recommended: the learning rate is not scaled up)",
    ]
    document = json.loads(advice.to_json())
    assert [change["what"] for change in document["within_noise"]] == ["checkpointing (3 blocks)"]
    assert document["changes"][0]["speedup_low"] == 1.7
    assert document["exploration"]["unsettled"]["measured"] == [140]

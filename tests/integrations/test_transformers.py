"""The Hugging Face Trainer adapter, on the real Trainer with tiny models built from configs, on the
CPU capped as a small device: the sizes it finds are the largest the Trainer's own steps run at
(found by running them), a run on two ranks agrees, an out-of-memory in training keeps the global
batch and one in evaluation shrinks only the eval batch, and a resumed run keeps its plan."""

from __future__ import annotations

import json
import logging
import math
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("transformers")

from hf_models import bert, gpt2, language_modelling, padded, token_examples
from transformers import Trainer, TrainingArguments

import batchfit
from batchfit.integrations.transformers import PLAN_FILE, BatchfitTrainer, TrainerPlan
from batchfit.units import parse_bytes

HERE = Path(__file__).resolve().parent


def arguments(tmp_path: Path, **changes: Any) -> TrainingArguments:
    """The Trainer on the CPU, quiet, saving nothing unless told."""
    base: dict[str, Any] = {
        "output_dir": str(tmp_path / "run"),
        "use_cpu": True,
        "report_to": [],
        "disable_tqdm": True,
        "save_strategy": "no",
        "logging_strategy": "no",
    }
    return TrainingArguments(**{**base, **changes})


@dataclass(frozen=True)
class Case:
    """A model, its data (longest examples first) and how the Trainer trains it."""

    name: str
    model: Callable[[], torch.nn.Module]
    train: list[dict[str, Any]]
    eval: list[dict[str, Any]]
    collate: Callable[[list[dict[str, Any]]], dict[str, torch.Tensor]]
    bf16: bool
    per_device_train_batch_size: int  # the batch asked: larger than fits, so it is split

    def trainer(self, tmp_path: Path, trainer: type[Trainer] = Trainer, **changes: Any) -> Any:
        options = {key: changes.pop(key) for key in ("memory_limit", "sizes") if key in changes}
        args = arguments(tmp_path, **{"bf16": self.bf16, "train_sampling_strategy": "sequential", **changes})
        return trainer(
            model=self.model(),
            args=args,
            train_dataset=self.train,
            eval_dataset=self.eval,
            data_collator=self.collate,
            **options,
        )


CASES = [
    # A causal language model in bf16 mixed precision (the CPU's), on examples of one length.
    Case("gpt2", gpt2, token_examples(96), token_examples(128, seed=1), language_modelling, True, 32),
    # A classifier in fp32 on examples of several lengths, padded to each batch's longest.
    Case("bert", bert, token_examples(96, (48, 32, 16)), token_examples(192, (48, 24), 1), padded, False, 48),
]


def runs(
    case: Case, tmp_path: Path, budget: int, train: int, accumulation: int, evaluate: int | None = None
) -> bool:
    """Whether the plain Trainer's own steps run under a cap of ``budget`` bytes: two optimizer steps
    of ``accumulation`` batches of ``train``, or one and then an evaluation at ``evaluate`` (the
    optimizer state resident, as inside training). The data repeat so that the loader's next batch
    is full whenever a step runs, as in a long run; each batch holds the longest examples."""
    evaluation = {} if evaluate is None else {"eval_strategy": "steps", "eval_steps": 1}
    steps = 2 if evaluate is None else 1
    trainer = case.trainer(
        tmp_path,
        per_device_train_batch_size=train,
        gradient_accumulation_steps=accumulation,
        per_device_eval_batch_size=evaluate or 1,
        max_steps=steps,
        **evaluation,
    )
    trainer.train_dataset = repeated(case.train, (steps * accumulation + 1) * train)
    trainer.eval_dataset = repeated(case.eval, 2 * (evaluate or 1))
    try:
        with batchfit.cap_memory(budget, resident=[trainer.model]):
            trainer.train()
    except torch.OutOfMemoryError:
        return False
    return True


def repeated(examples: list[dict[str, Any]], count: int) -> list[dict[str, Any]]:
    return [examples[index % len(examples)] for index in range(count)]


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_sizes_are_the_largest_the_trainers_steps_run_at_and_train_under_the_cap(
    case: Case, tmp_path: Path
) -> None:
    trainer = case.trainer(
        tmp_path,
        BatchfitTrainer,
        memory_limit="8MiB",
        per_device_train_batch_size=case.per_device_train_batch_size,
        max_steps=20,
        eval_strategy="steps",
        eval_steps=20,
    )
    plan = trainer.fit_batch_sizes()
    assert plan.train is not None and plan.eval is not None
    budget = plan.train.budget_bytes
    assert budget == int(0.8 * parse_bytes("8MiB"))
    largest, evaluated = plan.train.batch_size, plan.eval.batch_size
    asked = case.per_device_train_batch_size
    # The truth, by force: the plain Trainer's own steps under the same cap, at the micro-batch with
    # the accumulation that reaches the batch asked; its evaluation inside training at the plan.
    assert runs(case, tmp_path, budget, largest, math.ceil(asked / largest))
    assert not runs(case, tmp_path, budget, largest + 1, math.ceil(asked / (largest + 1)))
    micro, accumulation = plan.per_device_train_batch_size, plan.gradient_accumulation_steps
    assert runs(case, tmp_path, budget, micro, accumulation, evaluated)
    assert not runs(case, tmp_path, budget, micro, accumulation, evaluated + 1)
    # The global batch asked is kept: split into the largest micro-batch that divides it and fits.
    assert plan.per_device_train_batch_size <= largest < case.per_device_train_batch_size
    assert plan.global_batch_size == case.per_device_train_batch_size
    assert (trainer.args.per_device_train_batch_size, trainer.args.gradient_accumulation_steps) == (
        plan.per_device_train_batch_size,
        plan.gradient_accumulation_steps,
    )
    assert trainer.args.per_device_eval_batch_size == evaluated
    with batchfit.cap_memory(budget, resident=[trainer.model]):
        trainer.train()
    assert trainer.state.global_step == 20
    assert [entry["step"] for entry in trainer.state.log_history if "eval_loss" in entry] == [20]
    assert trainer.batchfit_plan == plan  # no out-of-memory changed it


@pytest.mark.distributed
def test_two_ranks_agree_on_the_smallest_devices_sizes_and_train_alike(tmp_path: Path) -> None:
    # Rank 0 stands in for a 24 MiB device and rank 1 for a 12 MiB one: both take the sizes that fit
    # rank 1. Rank 1 then trains on a 4 MiB device: its out-of-memory halves the micro-batch on both
    # ranks, and after two optimizer steps (gradients averaged over the ranks) both hold the same weights.
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(HERE), *sys.path])}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=2",
            str(HERE / "hf_ranks.py"),
            str(tmp_path),
            "4MiB",
        ],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"{rank}.json").read_text()) for rank in range(2)]
    assert ranks[0]["plan"] == ranks[1]["plan"]
    assert [rank["capacity_bytes"] for rank in ranks] == [parse_bytes("12MiB")] * 2
    assert [rank["world_size"] for rank in ranks] == [2, 2]
    plan = ranks[0]["plan"]
    assert plan["global_batch_size"] == 2 * 32 and plan["world_size"] == 2
    assert plan["per_device_train_batch_size"] < 32
    assert ranks[0]["trained"] == ranks[1]["trained"]
    changes = ranks[0]["trained"]["changes"]
    assert changes[0]["reason"] == "out of memory in the training step on rank 1"
    assert ranks[0]["trained"]["micro_batch_size"] < plan["micro_batch_size"]
    assert ranks[0]["trained"]["global_batch_size"] == plan["global_batch_size"]
    assert [rank["global_step"] for rank in ranks] == [2, 2]
    assert ranks[0]["weights"] == ranks[1]["weights"]


def test_an_out_of_memory_in_training_halves_the_micro_batch_and_keeps_the_global_batch(
    tmp_path: Path,
) -> None:
    # Sizes fitted on a 64 MiB device (32 samples fit), then trained on an 8 MiB one (they do not):
    # the first step runs out of memory for real and runs again as two micro-batches of 16.
    case = CASES[0]
    steps, tokens = 3, len(case.train[0]["input_ids"])
    common = {"per_device_train_batch_size": 32, "max_steps": steps, "learning_rate": 1e-3, "bf16": False}
    trainer = case.trainer(
        tmp_path / "split",
        BatchfitTrainer,
        memory_limit="64MiB",
        include_num_input_tokens_seen="all",
        logging_strategy="steps",
        logging_steps=1,
        **common,
    )
    assert trainer.fit_batch_sizes().micro_batch_size == 32
    with batchfit.cap_memory(int(0.8 * parse_bytes("8MiB")), resident=[trainer.model]):
        trainer.train()
    plan = trainer.batchfit_plan
    assert [(change.old_micro_batch_size, change.new_micro_batch_size) for change in plan.changes] == [
        (32, 16)
    ]
    assert (plan.micro_batch_size, plan.accumulation_steps, plan.global_batch_size) == (16, 2, 32)
    assert trainer.args.per_device_train_batch_size == 32  # the loader's batch, and so the data order
    assert trainer.state.global_step == steps
    assert trainer.state.num_input_tokens_seen == steps * 32 * tokens
    # The same training as at 16 samples per forward: the same learning rates, the same weights.
    reference = case.trainer(tmp_path / "reference", logging_strategy="steps", logging_steps=1, **common)
    reference.train()
    halved = case.trainer(tmp_path / "halved", **{**common, "per_device_train_batch_size": 16})
    halved.train()
    assert _rates(trainer) == _rates(reference) and len(_rates(trainer)) == steps
    assert _distance(trainer.model, reference.model) < 1e-5 < _distance(halved.model, reference.model)


def test_an_out_of_memory_in_evaluation_shrinks_the_eval_batch_alone(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Fitted on a 64 MiB device (the whole eval set in one batch), trained on an 8 MiB one where the
    # training batch fits and that eval batch does not.
    case = CASES[0]
    trainer = case.trainer(
        tmp_path,
        BatchfitTrainer,
        memory_limit="64MiB",
        bf16=False,
        per_device_train_batch_size=8,
        max_steps=2,
        eval_strategy="steps",
        eval_steps=2,
    )
    assert trainer.fit_batch_sizes().per_device_eval_batch_size == len(case.eval)
    with (
        caplog.at_level(logging.WARNING),
        batchfit.cap_memory(int(0.8 * parse_bytes("8MiB")), resident=[trainer.model]),
    ):
        trainer.train()
    plan = trainer.batchfit_plan
    halvings = [(change.old_micro_batch_size, change.new_micro_batch_size) for change in plan.eval_changes]
    assert halvings[0] == (len(case.eval), len(case.eval) // 2)
    assert all(new == old // 2 for old, new in halvings)
    assert trainer.args.per_device_eval_batch_size == halvings[-1][1] == plan.per_device_eval_batch_size
    assert (trainer.args.per_device_train_batch_size, plan.micro_batch_size, plan.changes) == (8, 8, ())
    assert trainer.state.global_step == 2
    assert [entry["step"] for entry in trainer.state.log_history if "eval_loss" in entry] == [2]
    told = [record.event for record in caplog.records if hasattr(record, "event")]
    assert [event.label for event in told] == ["eval"] * len(halvings)


def test_resume_keeps_the_plan_the_checkpoint_recorded_without_searching(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    case = CASES[0]
    common = {"per_device_train_batch_size": 32, "max_steps": 2, "bf16": False, "learning_rate": 1e-3}
    first = case.trainer(
        tmp_path, BatchfitTrainer, memory_limit="8MiB", save_strategy="steps", save_steps=1, **common
    )
    first.train()
    fitted = first.batchfit_plan
    assert fitted.source == "search" and fitted.gradient_accumulation_steps > 1
    checkpoint = tmp_path / "run" / "checkpoint-1"
    recorded = json.loads((checkpoint / PLAN_FILE).read_text())
    assert recorded == {**fitted.to_dict(evidence=False), "source": "search"}
    assert recorded["batchfit_version"] == batchfit.__version__
    # A new run on a larger device, where a search would give other sizes, resumes after step 1.
    resumed = case.trainer(tmp_path, BatchfitTrainer, memory_limit="64MiB", **common)
    with caplog.at_level(logging.INFO):
        resumed.train(resume_from_checkpoint=str(checkpoint))
    assert resumed.batchfit_plan == TrainerPlan.read(checkpoint)
    assert resumed.batchfit_plan.source == "checkpoint"
    assert (resumed.args.per_device_train_batch_size, resumed.args.gradient_accumulation_steps) == (
        fitted.per_device_train_batch_size,
        fitted.gradient_accumulation_steps,
    )
    stages = {record.event.stage for record in caplog.records if hasattr(record, "event")}
    assert stages == {"note"}  # no trial started: nothing was searched
    assert resumed.state.global_step == 2
    assert _distance(resumed.model, first.model) < 1e-6  # where the uninterrupted run ended


def _rates(trainer: Any) -> list[float]:
    return [entry["learning_rate"] for entry in trainer.state.log_history if "learning_rate" in entry]


def _distance(model: torch.nn.Module, other: torch.nn.Module) -> float:
    return max(
        (mine - theirs).abs().max().item()
        for mine, theirs in zip(model.parameters(), other.parameters(), strict=True)
    )


@pytest.mark.slow
def test_the_example_fits_trains_and_resumes_at_its_plan(tmp_path: Path) -> None:
    def example(*options: str) -> subprocess.CompletedProcess[str]:
        script = HERE.parents[1] / "examples" / "hf_trainer.py"
        command = [sys.executable, str(script), "--output-dir", str(tmp_path), *options]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        return subprocess.run(command, capture_output=True, text=True, timeout=300, env=env, check=False)

    def said(done: subprocess.CompletedProcess[str]) -> list[str]:  # its own lines, not the Trainer's
        assert done.returncode == 0, done.stderr[-3000:]
        return [line for line in done.stdout.splitlines() if not line.startswith("{")]

    searched, trained = said(example("--steps", "4"))
    assert searched.startswith("search: global_batch_size 48 = micro_batch_size ")
    assert trained.startswith("trained 4 steps")
    resumed = example("--steps", "6", "--resume")
    assert said(resumed)[0] == searched.replace("search:", "checkpoint:", 1)
    assert said(resumed)[1].startswith("trained 6 steps")
    assert "batch_size=" not in resumed.stderr  # no trial line: nothing was searched

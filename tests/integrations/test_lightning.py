"""The Lightning adapter on the real Trainer and tiny real models on a capped CPU: the size found
is the largest that real Lightning steps run under the cap (the truth by force), under the
Trainer's precision, clipping and accumulation; a global batch is kept by accumulation; the plan
rides in the checkpoint and a resumed run uses it; DDP ranks agree on the smallest device's."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("lightning")

import lightning.pytorch as pl
import lightning_workers
import torch
from lightning_tiny import Capped, Classifier, evaluates, trainer, trains
from torch.utils._pytree import tree_leaves
from torch.utils.data import DataLoader
from two_ranks import run_ranks

import batchfit
from batchfit import BatchSizes, ConfigurationError
from batchfit.integrations.lightning import BatchfitCallback

LIMIT = "1MiB"
BUDGET = int(0.8 * 2**20)  # memory_fraction 0.8 of LIMIT: the cap every trial runs under


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """One intra-op thread: on these tiny matrices a second buys nothing, and on a busy 2-core
    machine it spins, waiting for a core."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class StateAt(pl.Callback):
    """The weights, optimizer, schedulers and RNG as this callback finds them at the start of fit."""

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        schedulers = [config.scheduler.state_dict() for config in trainer.lr_scheduler_configs]
        weights = [tensor.clone() for tensor in pl_module.state_dict().values()]
        optimizer = trainer.optimizers[0].state_dict()
        self.leaves = tree_leaves([weights, optimizer, schedulers, torch.get_rng_state()])


def same(first: list[Any], second: list[Any]) -> bool:
    return len(first) == len(second) and all(
        torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b
        for a, b in zip(first, second, strict=True)
    )


@pytest.mark.parametrize(
    ("precision", "clipping", "accumulation", "optimizers"),
    [("32-true", "norm", 3, "dict"), ("bf16-mixed", "value", 1, "lists")],
)
def test_the_size_found_is_the_largest_the_trainer_s_steps_train_under_the_cap(
    precision: str, clipping: str, accumulation: int, optimizers: str
) -> None:
    # The step measured is the step that trains: under the Trainer's precision (bf16-mixed's
    # autocast keeps its casts), clipping and accumulation, with the optimizer and scheduler of
    # configure_optimizers (a dict, lists). Fresh Trainers train by force at the answer, under
    # the same cap, and fail at the next size; the fit itself then trains 20 steps under it.
    settings: dict[str, Any] = {
        "precision": precision,
        "gradient_clip_val": 0.5,
        "gradient_clip_algorithm": clipping,
        "accumulate_grad_batches": accumulation,
    }
    callback = BatchfitCallback(memory_limit=LIMIT, sizes=BatchSizes(max_batch_size=1024))
    before, after, capped = StateAt(), StateAt(), Capped(BUDGET)
    model = Classifier(optimizers=optimizers)
    run = trainer([before, callback, after, capped], max_steps=20, **settings)
    run.fit(model)
    found = callback.results["train"]
    assert found.budget_bytes == BUDGET and len(found.trials) <= 3  # the forecast placed them
    assert model.hparams.batch_size == run.train_dataloader.batch_size == found.batch_size
    assert capped.steps == 20
    assert same(before.leaves, after.leaves)  # weights, optimizer, scheduler and RNG as they were
    assert trains(found.batch_size, BUDGET, optimizers, **settings)
    assert not trains(found.batch_size + 1, BUDGET, optimizers, **settings)


@pytest.mark.parametrize("stage", ["validate", "test"])
def test_validate_and_test_set_the_largest_eval_batch_their_steps_run_under_the_cap(stage: str) -> None:
    callback = BatchfitCallback(
        memory_limit=LIMIT, sizes=BatchSizes(max_batch_size=1024), eval_batch_arg_name="eval_batch_size"
    )
    model = Classifier()
    run = trainer([callback], limit_val_batches=2, limit_test_batches=2)
    getattr(run, stage)(model, verbose=False)
    found = callback.results["eval"].batch_size
    loader = run.val_dataloaders if stage == "validate" else run.test_dataloaders
    assert model.hparams.eval_batch_size == loader.batch_size == found  # type: ignore[union-attr]
    assert model.hparams.batch_size == 4  # the train batch is another attribute's, untouched
    assert evaluates(found, BUDGET, stage) and not evaluates(found + 1, BUDGET, stage)


def test_a_global_batch_is_kept_by_accumulation_and_a_resumed_run_uses_the_checkpoint_s_plan(
    tmp_path: Path,
) -> None:
    def callback(memory_fraction: float = 0.8) -> BatchfitCallback:
        sizes = BatchSizes(global_batch_size=1000)
        return BatchfitCallback(
            memory_limit=LIMIT,
            memory_fraction=memory_fraction,
            sizes=sizes,
            eval_batch_arg_name="eval_batch_size",
        )

    # 1000 samples a step: the largest divisor of 1000 up to the size found, accumulated.
    # Validation every 4 batches runs at the eval size found with the training state resident.
    first, capped = callback(), Capped(BUDGET)
    run = trainer([first, capped], max_steps=2, limit_val_batches=1, val_check_interval=4)
    run.fit(Classifier())
    plan = first.plan
    assert plan is not None and plan.micro_batch_size is not None
    largest = first.results["train"].batch_size
    assert (plan.micro_batch_size, plan.accumulation_steps) == (250, 4) and largest < 500
    assert run.accumulate_grad_batches == 4 and run.train_dataloader.batch_size == 250  # type: ignore[union-attr]
    assert plan.eval_batch_size == first.results["eval"].batch_size
    assert capped.steps == 2 and capped.validated == 2  # trained, and validated twice, under the cap
    path = tmp_path / "run.ckpt"
    run.save_checkpoint(path)
    saved = torch.load(path, weights_only=False)["batchfit"]
    assert saved == {
        "micro_batch_size": 250,
        "accumulation_steps": 4,
        "world_size": 1,
        "eval_batch_size": plan.eval_batch_size,
        "devices": ["cpu (capped at 1.00 MiB)"],
        "memory_fraction": 0.8,
        "batchfit_version": batchfit.__version__,
        "global_batch_size": 1000,
    }

    # Resumed with the same settings: the checkpoint's plan, no search, two steps more.
    resumed, capped = callback(), Capped(BUDGET)
    model = Classifier()
    run = trainer([resumed, capped], max_steps=4, limit_val_batches=1, val_check_interval=4)
    run.fit(model, ckpt_path=path)
    assert resumed.results == {} and resumed.plan == plan
    assert (model.hparams.batch_size, model.hparams.eval_batch_size) == (250, plan.eval_batch_size)
    assert run.accumulate_grad_batches == 4 and capped.steps == 4

    # A smaller memory_fraction than the checkpoint's: it searches again.
    again = callback(memory_fraction=0.7)
    trainer([again], max_steps=3, limit_val_batches=0).fit(Classifier(), ckpt_path=path)
    assert again.results["train"].budget_bytes == int(0.7 * 2**20)
    assert again.plan is not None and again.plan.memory_fraction == 0.7


class ManualClassifier(Classifier):
    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False


@pytest.mark.parametrize(
    ("case", "message"),
    [
        (
            "attribute",
            (
                "Classifier exposes no 'bs': neither the module, its hparams nor its datamodule has it, "
                "so a batch size found could not reach its DataLoader. Give the module (or its "
                "LightningDataModule) a bs attribute that its dataloader hooks read (self.bs = 32, or an "
                "__init__ argument kept by save_hyperparameters()), or pass batch_arg_name= the one they "
                "read."
            ),
        ),
        (
            "loaders",
            (
                "trainer.fit(train_dataloaders=...) hands the Trainer DataLoaders built at their batch size "
                "already, which a size found cannot change. Build them in the LightningModule's (or "
                "LightningDataModule's) train_dataloader() from its batch_size attribute."
            ),
        ),
        (
            "manual",
            (
                "ManualClassifier sets automatic_optimization=False: its training_step runs its own backward "
                "and optimizer step, through the strategy's collectives. The callback measures automatic "
                "optimization; search a step of your own with batchfit.find_batch_size."
            ),
        ),
    ],
)
def test_a_run_the_callback_cannot_size_is_refused_with_what_to_do(case: str, message: str) -> None:
    name = "bs" if case == "attribute" else "batch_size"
    callback = BatchfitCallback(memory_limit=LIMIT, batch_arg_name=name)
    model = ManualClassifier() if case == "manual" else Classifier()
    loaders = DataLoader(model.data, batch_size=4) if case == "loaders" else None
    with pytest.raises(ConfigurationError) as raised:
        trainer([callback], max_steps=1).fit(model, train_dataloaders=loaders)
    assert str(raised.value) == message


def spawn(tmp_path: Path, limits: list[str], sharded: bool) -> list[dict[str, Any]]:
    """Two ranks fit with the callback, each on a CPU capped at its limit; their reports (index =
    rank). Fails on a hang."""
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    run_ranks(lightning_workers.main, (port, limits, str(tmp_path), sharded), "the Lightning fit")
    reports = [json.loads((tmp_path / f"{rank}.json").read_text()) for rank in range(2)]
    assert all("error" not in report for report in reports), reports
    return reports


def check_agreed(reports: list[dict[str, Any]], limits: list[str]) -> None:
    """Both ranks ran the same trials, got the same plan and trained at it, each under its own cap."""
    first, second = reports
    assert first["plan"] == second["plan"]
    assert first["plan"]["devices"] == [f"cpu (capped at {limit[:-3]}.00 MiB)" for limit in limits]
    assert first["world_size"] == 2 and first["plan"]["world_size"] == 2
    assert first["trials"] == second["trials"] and first["outcomes"] == second["outcomes"]
    for report in reports:
        assert report["loader_batch_size"] == report["batch_size"] == first["batch_size"]
        assert report["steps"] == lightning_workers.STEPS


@pytest.mark.distributed
def test_ddp_ranks_with_different_caps_train_at_the_smaller_device_s_answer(tmp_path: Path) -> None:
    # Lightning's own DDP strategy on a 2-rank gloo group, launched as torchrun would; rank 0
    # plays a 1 MiB device, rank 1 a 2 MiB one. Both search in lockstep, get rank 0's answer
    # (DDP's gradient buckets counted), and train at it, each under its own cap, all-reducing.
    limits = ["1MiB", "2MiB"]
    reports = spawn(tmp_path, limits, sharded=False)
    check_agreed(reports, limits)
    pairs = zip(reports[0]["outcomes"], reports[0]["details"], strict=True)
    failed = [detail for outcome, detail in pairs if outcome != "ok"]
    assert failed and all(detail.startswith("rank 0: ") for detail in failed)  # rank 1 had room


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.skipif(not lightning_workers.FULLY_SHARD, reason="fully_shard runs on the CPU from torch 2.7")
def test_fsdp2_ranks_under_model_parallel_strategy_agree_and_train(tmp_path: Path) -> None:
    # ModelParallelStrategy with fully_shard in configure_model: the trials run FSDP2's
    # collectives, which no fake-tensor forecast runs, so real trials alone find the answer. The
    # caps are equal: a rank out of memory inside FSDP2's forward or backward, where the other
    # does not run out, can leave the other waiting in a collective (README, Limits).
    limits = ["1MiB", "1MiB"]
    check_agreed(spawn(tmp_path, limits, sharded=True), limits)

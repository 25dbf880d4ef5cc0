"""The Lightning adapter on the real Trainer and tiny real models on a capped CPU: the size found
is the largest that real Lightning steps run under the cap (the truth by force), under the
Trainer's precision, clipping and accumulation; a global batch is kept by accumulation; the plan
rides in the checkpoint and a resumed run uses it; DDP ranks agree on the smallest device's."""

from __future__ import annotations

import json
import logging
import socket
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("lightning")

import lightning.pytorch as pl
import lightning_workers
import torch
from lightning.pytorch.callbacks import GradientAccumulationScheduler
from lightning_tiny import Capped, Classifier, Regressor, evaluates, one_step, trainer, trains
from torch.utils._pytree import tree_leaves
from torch.utils.data import BatchSampler, DataLoader, SequentialSampler
from two_ranks import run_ranks

import batchfit
from batchfit import BatchSizes, ConfigurationError
from batchfit.errors import ArgumentTypeError
from batchfit.integrations.lightning import BatchfitCallback, LoaderBatchSizeError

LIMIT = "1MiB"
BUDGET = int(0.8 * 2**20)  # memory_fraction 0.8 of LIMIT: the cap every trial runs under


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
    # the same cap, and fail at the next size; the fit itself then trains 20 steps under it, at
    # the global batch changed as asked (keep_global_batch_size=False).
    settings: dict[str, Any] = {
        "precision": precision,
        "gradient_clip_val": 0.5,
        "gradient_clip_algorithm": clipping,
        "accumulate_grad_batches": accumulation,
    }
    callback = BatchfitCallback(
        memory_limit=LIMIT, sizes=BatchSizes(max_batch_size=1024), keep_global_batch_size=False
    )
    before, after, capped = StateAt(), StateAt(), Capped(BUDGET)
    model = Classifier(optimizers=optimizers)
    run = trainer([before, callback, after, capped], max_steps=20, **settings)
    run.fit(model)
    found = callback.results["train"]
    assert found.budget_bytes == BUDGET and len(found.trials) <= 3  # the forecast placed them
    assert model.hparams.batch_size == run.train_dataloader.batch_size == found.batch_size
    assert callback.plan is not None and callback.plan.global_batch_size == found.batch_size * accumulation
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


#: A cap under which the Regressor's float64 steps fit 20 samples (its search's answer), so that
#: a global batch of 64 or 60 must be split.
SMALL_LIMIT = "64KiB"


@pytest.mark.parametrize(
    ("case", "batch_size", "accumulation", "sizes", "planned", "samples", "reference"),
    [
        # Without global_batch_size: the Trainer's own 32 x 2, kept as 16 x 4.
        ("configured", 32, 2, BatchSizes(), (16, 4), 64, (32, 2)),
        # global_batch_size=60: 20 x 3, against the user's one batch of 60.
        ("global", 4, 1, BatchSizes(global_batch_size=60), (20, 3), 60, (60, 1)),
    ],
)
def test_the_plan_trains_the_optimizer_step_the_user_s_configuration_trains(
    case: str,
    batch_size: int,
    accumulation: int,
    sizes: BatchSizes,
    planned: tuple[int, int],
    samples: int,
    reference: tuple[int, int],
) -> None:
    # Real float64 Lightning fits ("64-true", SGD, no clipping, no BatchNorm), one optimizer step
    # over a dataset of one global batch: the callback's plan under a cap where 20 samples fit,
    # against the configuration it stands for, run without the callback or a cap.
    callback = BatchfitCallback(memory_limit=SMALL_LIMIT, sizes=sizes)
    gradients, parameters, loss, micro_batches = one_step(
        Regressor(batch_size, samples), [callback], accumulation
    )
    assert callback.results["train"].batch_size == 20
    assert callback.plan is not None
    assert (callback.plan.micro_batch_size, callback.plan.accumulation_steps) == planned
    assert micro_batches == [planned[0]] * planned[1]  # the batches it trained were split so
    user = one_step(Regressor(reference[0], samples), [], reference[1])
    assert user[3] == [reference[0]] * reference[1]
    for mine, theirs in [*zip(gradients, user[0], strict=True), *zip(parameters, user[1], strict=True)]:
        assert mine.dtype == torch.float64 and torch.allclose(mine, theirs, rtol=0, atol=1e-10)
    assert loss.dtype == torch.float64 and abs(loss.item() - user[2].item()) <= 1e-10
    assert not torch.equal(parameters[0], Regressor().net[0].weight)  # the step moved the weights


@pytest.mark.parametrize(
    ("sizes", "message"),
    [
        (
            BatchSizes(),
            (
                "the configured global batch, 37 (the train loader's batch_size 37 x accumulate_grad_batches "
                "1 x world_size 1) is 37 samples per device, and the largest micro-batch that divides it up "
                "to the 20 that fit is 1 (37 accumulation steps), under half of 20. Lightning weights every "
                "accumulated batch equally, so micro-batches of another size would change the step. Pass "
                "sizes=batchfit.BatchSizes(global_batch_size=N) with N a multiple of world_size x 20 (20 or "
                "40), or keep_global_batch_size=False to train the 20 that fit at the Trainer's "
                "accumulate_grad_batches (a global batch of 20 x accumulate_grad_batches x world_size)."
            ),
        ),
        (
            BatchSizes(global_batch_size=37),
            (
                "sizes.global_batch_size=37 is 37 samples per device, and the largest micro-batch that "
                "divides it up to the 20 that fit is 1 (37 accumulation steps), under half of 20. Lightning "
                "weights every accumulated batch equally, so micro-batches of another size would change the "
                "step. Pass sizes=batchfit.BatchSizes(global_batch_size=N) with N a multiple of world_size x "
                "20 (20 or 40)."
            ),
        ),
    ],
)
def test_a_global_batch_that_splits_only_into_small_micro_batches_is_refused(
    sizes: BatchSizes, message: str
) -> None:
    callback = BatchfitCallback(memory_limit=SMALL_LIMIT, sizes=sizes)
    with pytest.raises(ConfigurationError) as raised:
        one_step(Regressor(37, samples=37), [callback])
    assert str(raised.value) == message


def test_a_loader_that_ignores_the_planned_batch_is_stopped_at_its_first_batch() -> None:
    # train_dataloader() trains 32 whatever hparams.batch_size says: the plan's 16 x 4 would
    # train 32 x 4 a step. Stopped before the first forward, the weights as they were.
    callback = BatchfitCallback(memory_limit=SMALL_LIMIT)
    model = Regressor(batch_size=32, fixed_batch_size=32)
    with pytest.raises(LoaderBatchSizeError) as raised:
        one_step(model, [callback], accumulation=2)
    assert str(raised.value) == (
        "the first training batch holds 32 samples, but the plan trains micro_batch_size 16 x "
        "accumulation_steps 4, set as Regressor.hparams.batch_size: train_dataloader() does not build "
        "its batches from it, so each optimizer step would train 32 x 4 samples per device. Build the "
        "train DataLoader with its batch_size read from Regressor.hparams.batch_size, or pass "
        "batch_arg_name= the attribute it reads."
    )
    assert isinstance(raised.value, batchfit.BatchfitError)
    assert torch.equal(model.net[0].weight, Regressor().net[0].weight)


def test_batch_norm_over_a_smaller_micro_batch_is_warned_of(caplog: pytest.LogCaptureFixture) -> None:
    # BatchNorm normalises over the micro-batch: the step changes with it, and a warning says so.
    callback = BatchfitCallback(memory_limit=SMALL_LIMIT)
    with caplog.at_level(logging.WARNING, logger="batchfit.integrations.lightning"):
        gradients = one_step(Regressor(32, batch_norm=True), [callback], accumulation=2)[0]
    assert callback.plan is not None and callback.plan.micro_batch_size == 8
    warnings = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert warnings == [
        (
            "BatchNorm1d normalises over each micro-batch: with micro_batch_size 8 instead of the loader's "
            "batch_size 32 its batch statistics (and so the step and its running statistics) change. "
            "GroupNorm or LayerNorm are the same at any micro-batch; or give the Trainer a loader batch "
            "that fits."
        )
    ]
    user = one_step(Regressor(32, batch_norm=True), [], accumulation=2)[0]
    assert (gradients[0] - user[0]).abs().max() > 1e-6  # what the warning is for


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (
            {"sizes": 64},
            (
                "BatchfitCallback's sizes must be a batchfit.BatchSizes, got int (64); pass "
                "sizes=batchfit.BatchSizes(max_batch_size=64)."
            ),
        ),
        (
            {"trials": 3},
            (
                "BatchfitCallback's trials must be a batchfit.Trials, got int (3); pass "
                "trials=batchfit.Trials(steps_per_trial=3)."
            ),
        ),
        (
            {"batch_arg_name": 32},
            (
                "BatchfitCallback's batch_arg_name must be a str, got int (32); pass batch_arg_name= the "
                "name of the attribute "
                "train_dataloader() reads, such as 'batch_size'."
            ),
        ),
        (
            {"eval_batch_arg_name": ["eval_batch_size"]},
            (
                "BatchfitCallback's eval_batch_arg_name must be a str or None, got list "
                "(['eval_batch_size']); pass "
                "eval_batch_arg_name= the name of the attribute the eval loaders read, such as "
                "'eval_batch_size'."
            ),
        ),
        (
            {"keep_global_batch_size": "no"},
            "BatchfitCallback's keep_global_batch_size must be True or False, got str ('no').",
        ),
    ],
)
def test_arguments_of_the_wrong_type_are_refused_at_construction(
    arguments: dict[str, Any], message: str
) -> None:
    with pytest.raises(ArgumentTypeError) as raised:
        BatchfitCallback(**arguments)
    assert str(raised.value) == message
    assert isinstance(raised.value, TypeError) and isinstance(raised.value, ConfigurationError)


def test_a_global_batch_to_keep_and_one_to_change_are_refused_together() -> None:
    with pytest.raises(ConfigurationError) as raised:
        BatchfitCallback(sizes=BatchSizes(global_batch_size=64), keep_global_batch_size=False)
    assert str(raised.value) == (
        "sizes.global_batch_size=64 is the global batch to keep, and keep_global_batch_size=False asks "
        "to change it to the batch that fits: pass one of the two."
    )


class ManualClassifier(Classifier):
    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False


class SampledClassifier(Classifier):
    """Batched by a batch_sampler: its DataLoader has no batch_size."""

    def train_dataloader(self) -> DataLoader[Any]:
        batches = BatchSampler(SequentialSampler(self.data), self.hparams.batch_size, drop_last=False)
        return DataLoader(self.data, batch_sampler=batches)


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
        (
            "sampler",
            (
                "train_dataloader() returned a DataLoader with no batch_size (a batch_sampler batches it), "
                "so the global batch it trains is unknown and the callback cannot keep it. Pass "
                "sizes=batchfit.BatchSizes(global_batch_size=N) with the global batch to train, or "
                "keep_global_batch_size=False to train the batch that fits."
            ),
        ),
        (
            "scheduler",
            (
                "a GradientAccumulationScheduler changes accumulate_grad_batches every epoch, and with it "
                "the global batch, which the callback keeps by setting accumulate_grad_batches: remove the "
                "scheduler, or pass keep_global_batch_size=False to train the batch that fits at the "
                "scheduler's accumulation."
            ),
        ),
    ],
)
def test_a_run_the_callback_cannot_size_is_refused_with_what_to_do(case: str, message: str) -> None:
    name = "bs" if case == "attribute" else "batch_size"
    callback = BatchfitCallback(memory_limit=LIMIT, batch_arg_name=name)
    models = {"manual": ManualClassifier, "sampler": SampledClassifier}
    model = models.get(case, Classifier)()
    loaders = DataLoader(model.data, batch_size=4) if case == "loaders" else None
    callbacks: list[pl.Callback] = [callback]
    if case == "scheduler":
        callbacks.append(GradientAccumulationScheduler({0: 2}))
    with pytest.raises(ConfigurationError) as raised:
        trainer(callbacks, max_steps=1).fit(model, train_dataloaders=loaders)
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
    """Both ranks ran the same trials, got the same plan and trained at it, each under its own cap:
    the configured global batch (BATCH_SIZE a rank x 2 ranks) kept, in micro-batches of the
    largest divisor of BATCH_SIZE up to the size found."""
    first, second = reports
    plan = first["plan"]
    assert plan == second["plan"]
    assert plan["devices"] == [f"cpu (capped at {limit[:-3]}.00 MiB)" for limit in limits]
    assert first["world_size"] == 2 and plan["world_size"] == 2
    assert first["trials"] == second["trials"] and first["outcomes"] == second["outcomes"]
    assert plan["global_batch_size"] == 2 * lightning_workers.BATCH_SIZE
    per_rank = lightning_workers.BATCH_SIZE
    largest = max(size for size in range(1, first["batch_size"] + 1) if per_rank % size == 0)
    assert plan["micro_batch_size"] == largest and plan["accumulation_steps"] == per_rank // largest
    for report in reports:
        assert report["batch_size"] == first["batch_size"] < per_rank
        assert report["loader_batch_size"] == plan["micro_batch_size"]
        assert report["accumulate_grad_batches"] == plan["accumulation_steps"]
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

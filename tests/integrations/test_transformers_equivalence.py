"""The Hugging Face Trainer adapter changes the batch, never the step: where its plan splits the
per-device batch the TrainingArguments ask into other micro-batches, or an out-of-memory halves it,
one optimizer step (float64, SGD, no clipping) gives the gradients, the weights and the logged loss
of the plain Trainer at the user's own sizes; a loss no weight keeps so is refused. Also: the
search puts every random generator back, and wrong keyword types are named at construction."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy
import pytest
import torch

pytest.importorskip("transformers")

from hf_models import bert, gpt2, language_modelling, padded, token_examples
from transformers import Trainer, TrainerCallback, TrainingArguments

import batchfit
from batchfit.errors import ArgumentTypeError
from batchfit.integrations.transformers import BatchfitTrainer
from batchfit.integrations.transformers.loss_weights import LossReductionError

ASKED, ACCUMULATION = 8, 2  # the user's per_device_train_batch_size x gradient_accumulation_steps


class PlainClassifier(torch.nn.Module):
    """The BERT classifier behind a forward without ``**kwargs``: the Trainer passes it no
    ``num_items_in_batch`` and divides its loss by the accumulation steps."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = bert()

    def forward(self, input_ids: Any, attention_mask: Any = None, labels: Any = None) -> Any:
        return self.inner(input_ids=input_ids, attention_mask=attention_mask, labels=labels)


def summed_cross_entropy(outputs: Any, labels: Any, num_items_in_batch: Any = None) -> Any:
    """A ``compute_loss_func`` that sums over the step's examples and divides by their count."""
    return torch.nn.functional.cross_entropy(outputs.logits, labels, reduction="sum") / num_items_in_batch


def mean_cross_entropy(outputs: Any, labels: Any, num_items_in_batch: Any = None) -> Any:
    """A ``compute_loss_func`` that ignores ``num_items_in_batch``: each batch's mean, which the
    Trainer adds up over the accumulation without dividing."""
    return torch.nn.functional.cross_entropy(outputs.logits, labels)


def token_mean(outputs: Any, labels: Any, num_items_in_batch: Any = None) -> Any:
    """A language model's mean over each batch's tokens, ignoring ``num_items_in_batch``."""
    logits = outputs.logits[:, :-1].reshape(-1, outputs.logits.shape[-1])
    return torch.nn.functional.cross_entropy(logits, labels[:, 1:].reshape(-1))


class SummedLoss:
    """A Trainer subclass's own ``compute_loss``: the batch's summed cross entropy."""

    def compute_loss(self, model: Any, inputs: Any, return_outputs: bool = False, **kwargs: Any) -> Any:
        labels = inputs.pop("labels")
        outputs = model(**inputs)
        loss = torch.nn.functional.cross_entropy(outputs.logits, labels, reduction="sum")
        return (loss, outputs) if return_outputs else loss


class PlainSummed(SummedLoss, Trainer):  # type: ignore[misc]
    pass


class BatchfitSummed(SummedLoss, BatchfitTrainer):
    pass


class Gradients(TrainerCallback):  # type: ignore[misc]
    """The gradients as the optimizer step finds them."""

    def on_pre_optimizer_step(
        self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any
    ) -> None:
        self.seen = [parameter.grad.detach().clone() for parameter in model.parameters()]


def arguments(tmp_path: Path, **changes: Any) -> TrainingArguments:
    """The Trainer on the CPU, quiet, saving nothing."""
    base = {"use_cpu": True, "report_to": [], "disable_tqdm": True, "save_strategy": "no"}
    return TrainingArguments(output_dir=str(tmp_path / "run"), **{**base, **changes})


CLASSIFICATION = token_examples(2 * ASKED * ACCUMULATION, (24, 16, 8))
LANGUAGE = token_examples(2 * ASKED * ACCUMULATION, (24,))


def one_step(
    tmp_path: Path,
    trainer_class: type[Trainer],
    model: Callable[[], torch.nn.Module],
    collate: Callable[..., Any],
    **changes: Any,
) -> tuple[Any, list[torch.Tensor]]:
    """One optimizer step in float64 of ``ASKED`` x ``ACCUMULATION`` samples, by SGD without
    clipping; the trainer and the gradients the step found."""
    options = {
        key: changes.pop(key) for key in ("memory_limit", "sizes", "compute_loss_func") if key in changes
    }
    cap = changes.pop("cap", None)
    train = changes.pop("train", LANGUAGE if collate is language_modelling else CLASSIFICATION)
    args = arguments(
        tmp_path,
        **{
            "logging_strategy": "steps",
            "logging_steps": 1,
            "per_device_train_batch_size": ASKED,
            "gradient_accumulation_steps": ACCUMULATION,
            "max_steps": 1,
            "optim": "sgd",
            "learning_rate": 0.5,
            "lr_scheduler_type": "constant",
            "weight_decay": 0.0,
            "max_grad_norm": 0.0,
            "train_sampling_strategy": "sequential",
            **changes,
        },
    )
    gradients = Gradients()
    trainer = trainer_class(
        model=model().double(),
        args=args,
        train_dataset=train,
        data_collator=collate,
        callbacks=[gradients],
        **options,
    )
    if isinstance(trainer, BatchfitTrainer):
        trainer.fit_batch_sizes()
    if cap is None:
        trainer.train()
    else:
        with batchfit.cap_memory(cap, resident=[trainer.model]):
            trainer.train()
    return trainer, gradients.seen


def assert_same_step(
    mine: tuple[Any, list[torch.Tensor]], theirs: tuple[Any, list[torch.Tensor]], steps: int = 1
) -> None:
    """The same gradients before the last optimizer step, weights after it and logged losses."""
    (trainer, gradients), (reference, expected) = mine, theirs
    assert trainer.state.global_step == reference.state.global_step == steps
    assert len(gradients) == len(expected)
    for got, want in zip(gradients, expected, strict=True):
        assert (got - want).abs().max().item() <= 1e-10
    for got, want in zip(trainer.model.parameters(), reference.model.parameters(), strict=True):
        assert got.dtype == torch.float64 and (got - want).abs().max().item() <= 1e-10
    # The Trainer adds the logged loss up in a float32 tensor: equal to its rounding.
    logged = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    wanted = [entry["loss"] for entry in reference.state.log_history if "loss" in entry]
    assert len(logged) == steps and logged == pytest.approx(wanted, rel=1e-6, abs=0)


SPLITS = [
    # BERT's forward takes **kwargs: the Trainer passes num_items_in_batch, which its loss ignores
    # (a mean per batch), and does not divide by the accumulation.
    pytest.param(bert, padded, {}, id="kwargs-mean"),
    # GPT-2's loss is a sum divided by num_items_in_batch.
    pytest.param(gpt2, language_modelling, {}, id="kwargs-num-items"),
    pytest.param(
        gpt2, language_modelling, {"average_tokens_across_devices": False}, id="num-items-not-averaged"
    ),
    pytest.param(
        bert, padded, {"average_tokens_across_devices": False}, id="mean-not-averaged", marks=pytest.mark.slow
    ),
    # A forward without **kwargs: no num_items_in_batch, and the Trainer divides.
    pytest.param(PlainClassifier, padded, {}, id="no-kwargs"),
    pytest.param(bert, padded, {"compute_loss_func": summed_cross_entropy}, id="loss-func-num-items"),
    pytest.param(bert, padded, {"compute_loss_func": mean_cross_entropy}, id="loss-func-mean"),
]


@pytest.mark.parametrize(("model", "collate", "changes"), SPLITS)
def test_the_plans_split_gives_the_users_own_optimizer_step(
    tmp_path: Path, model: Callable[[], torch.nn.Module], collate: Callable[..., Any], changes: dict[str, Any]
) -> None:
    # 8 x 2 asked, at most 4 samples per forward: the plan trains 4 x 4.
    mine = one_step(
        tmp_path / "mine",
        BatchfitTrainer,
        model,
        collate,
        sizes=batchfit.BatchSizes(max_batch_size=4),
        **changes,
    )
    plan = mine[0].batchfit_plan
    assert (plan.per_device_train_batch_size, plan.gradient_accumulation_steps) == (4, 4)
    assert_same_step(mine, one_step(tmp_path / "theirs", Trainer, model, collate, **changes))


def test_a_subclass_compute_loss_keeps_its_step_through_the_split(tmp_path: Path) -> None:
    # A summed loss that the Trainer, seeing BERT's **kwargs, takes as scaled already.
    mine = one_step(
        tmp_path / "mine", BatchfitSummed, bert, padded, sizes=batchfit.BatchSizes(max_batch_size=4)
    )
    assert mine[0].batchfit_plan.per_device_train_batch_size == 4
    assert_same_step(mine, one_step(tmp_path / "theirs", PlainSummed, bert, padded))


@pytest.mark.parametrize(
    ("model", "collate"),
    [pytest.param(bert, padded, id="kwargs-mean"), pytest.param(gpt2, language_modelling, id="num-items")],
)
def test_an_out_of_memory_halving_gives_the_users_own_optimizer_step(
    tmp_path: Path, model: Callable[[], torch.nn.Module], collate: Callable[..., Any]
) -> None:
    # The plan keeps 8 x 2; training then runs under a cap between the peaks of the plain Trainer's
    # step at 4 and at 8 samples, so the first batch runs out of memory and runs again as 4 + 4.
    cap = halving_cap(tmp_path, model, collate)
    mine = one_step(
        tmp_path / "mine",
        BatchfitTrainer,
        model,
        collate,
        sizes=batchfit.BatchSizes(max_batch_size=ASKED),
        cap=cap,
    )
    plan = mine[0].batchfit_plan
    assert [(change.old_micro_batch_size, change.new_micro_batch_size) for change in plan.changes] == [
        (ASKED, 4)
    ]
    assert (plan.per_device_train_batch_size, plan.gradient_accumulation_steps) == (ASKED, ACCUMULATION)
    assert_same_step(mine, one_step(tmp_path / "theirs", Trainer, model, collate))


def halving_cap(tmp_path: Path, model: Callable[[], torch.nn.Module], collate: Callable[..., Any]) -> int:
    """A cap between the peaks of the plain Trainer's step (float64, SGD) at 4 and at 8 samples."""

    def peak(size: int) -> int:
        trainer = Trainer(
            model=model().double(),
            args=arguments(
                tmp_path / f"peak{size}",
                per_device_train_batch_size=size,
                max_steps=1,
                optim="sgd",
                max_grad_norm=0.0,
                train_sampling_strategy="sequential",
            ),
            train_dataset=LANGUAGE if collate is language_modelling else CLASSIFICATION,
            data_collator=collate,
        )
        with batchfit.cap_memory("1GiB", resident=[trainer.model]) as measured:
            trainer.train()
        return int(measured.peak_bytes)

    low, high = peak(4), peak(ASKED)
    assert low < high
    return (low + high) // 2


@pytest.mark.parametrize(
    "largest",
    [pytest.param(4, id="re-split-4x4", marks=pytest.mark.slow), pytest.param(16, id="merged-16x1")],
)
@pytest.mark.parametrize(
    "model", [pytest.param(bert, id="kwargs-mean"), pytest.param(PlainClassifier, id="no-kwargs")]
)
def test_the_epochs_last_shorter_step_is_the_users_own(
    tmp_path: Path, model: Callable[[], torch.nn.Module], largest: int
) -> None:
    # 28 examples at 8 x 2: the second step holds the user's batches of 8 and 4, each a mean over
    # its own samples. The plan's 16 x 1 runs them as one batch of 12, cut into 8 + 4.
    changes = {"train": CLASSIFICATION[:28], "max_steps": 2}
    sizes = batchfit.BatchSizes(max_batch_size=largest)
    mine = one_step(tmp_path / "mine", BatchfitTrainer, model, padded, sizes=sizes, **changes)
    plan = mine[0].batchfit_plan
    assert (plan.per_device_train_batch_size, plan.gradient_accumulation_steps) == (largest, 16 // largest)
    assert_same_step(mine, one_step(tmp_path / "theirs", Trainer, model, padded, **changes), steps=2)


def token_mean_finding(model: torch.nn.Module) -> str:
    """What the probe reports for ``token_mean``: the loss of the longest and the shortest example
    (all are as long: the first and the last) together, and of each alone."""
    pair = language_modelling([LANGUAGE[0], LANGUAGE[-1]])
    with torch.no_grad():
        together, first, second = (
            token_mean(model(input_ids=part["input_ids"]), part["labels"]).item()
            for part in (
                pair,
                {key: value[:1] for key, value in pair.items()},
                {key: value[1:] for key, value in pair.items()},
            )
        )
    return (
        f"the Trainer's loss of two training examples is {together:.6g}, and of each alone (with the same "
        f"num_items_in_batch) {first:.6g} and {second:.6g}: their mean, over examples without exactly one "
        f"label each (a mean over tokens?), so no weight of each micro-batch's loss gives the step of the "
        f"batches asked. Make the loss a sum divided by num_items_in_batch (a model whose forward takes "
        f"it, or compute_loss_func), a sum, or a mean over examples with one label each; or train with "
        f"the plain Trainer at sizes that fit."
    )


def test_an_out_of_memory_under_a_loss_averaged_over_tokens_is_refused_not_halved(tmp_path: Path) -> None:
    # No split at fitting (8 x 2 fits), so no refusal then; the out-of-memory under the cap would
    # halve the batch, which no weight keeps under this loss.
    cap = halving_cap(tmp_path, gpt2, language_modelling)
    with pytest.raises(LossReductionError) as raised:
        one_step(
            tmp_path / "mine",
            BatchfitTrainer,
            gpt2,
            language_modelling,
            compute_loss_func=token_mean,
            sizes=batchfit.BatchSizes(max_batch_size=ASKED),
            cap=cap,
        )
    assert str(raised.value) == (
        "batchfit would run samples 0 to 3 of an optimizer step as one micro-batch (micro_batch_size 4, "
        "halved after an out-of-memory in training), where per_device_train_batch_size is 8, and cannot "
        f"keep the optimizer step so: {token_mean_finding(gpt2().double())}"
    )


def test_a_loss_averaged_over_each_batchs_tokens_is_refused_before_the_split(tmp_path: Path) -> None:
    trainer = BatchfitTrainer(
        model=gpt2().double(),
        args=arguments(
            tmp_path,
            per_device_train_batch_size=ASKED,
            gradient_accumulation_steps=ACCUMULATION,
        ),
        train_dataset=LANGUAGE,
        data_collator=language_modelling,
        compute_loss_func=token_mean,
        sizes=batchfit.BatchSizes(max_batch_size=4),
    )
    with pytest.raises(LossReductionError) as raised:
        trainer.fit_batch_sizes()
    assert str(raised.value) == (
        "batchfit's plan trains micro_batch_size 4 x accumulation_steps 4 where per_device_train_batch_size "
        f"is 8, and cannot keep the optimizer step so: {token_mean_finding(trainer.model)}"
    )
    assert (trainer.args.per_device_train_batch_size, trainer.args.gradient_accumulation_steps) == (8, 2)
    assert trainer.batchfit_plan is None


class Augmenting(torch.utils.data.Dataset[dict[str, Any]]):
    """Examples whose ``__getitem__`` draws from Python's, numpy's and torch's generators, as an
    augmentation does."""

    def __init__(self, examples: list[dict[str, Any]]) -> None:
        self.examples = examples

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, index: int) -> dict[str, Any]:
        shift = random.randrange(3) + int(numpy.random.randint(3)) + int(torch.randint(3, ()))
        example = self.examples[index]
        return {**example, "input_ids": [(token + shift) % 256 for token in example["input_ids"]]}


def test_fitting_puts_every_random_generator_back(tmp_path: Path) -> None:
    trainer = BatchfitTrainer(
        model=bert(),
        args=arguments(
            tmp_path,
            per_device_train_batch_size=ASKED,
            gradient_accumulation_steps=ACCUMULATION,
        ),
        train_dataset=Augmenting(CLASSIFICATION),
        eval_dataset=Augmenting(CLASSIFICATION[:8]),
        data_collator=padded,
        memory_limit="64MiB",
        sizes=batchfit.BatchSizes(max_batch_size=4),
    )
    before = (torch.get_rng_state(), numpy.random.get_state(), random.getstate())
    trainer.fit_batch_sizes()
    after = (torch.get_rng_state(), numpy.random.get_state(), random.getstate())
    assert torch.equal(before[0], after[0])
    assert before[1][0] == after[1][0] and numpy.array_equal(before[1][1], after[1][1])
    assert before[1][2:] == after[1][2:]
    assert before[2] == after[2]
    # The dataset did draw: a fetch outside the search moves all three.
    trainer.train_dataset[0]
    assert not torch.equal(torch.get_rng_state(), after[0]) and random.getstate() != after[2]
    assert (
        not numpy.array_equal(numpy.random.get_state()[1], after[1][1])
        or numpy.random.get_state()[2] != after[1][2]
    )


@pytest.mark.parametrize(
    ("keyword", "value", "message"),
    [
        (
            "sizes",
            64,
            (
                "BatchfitTrainer's sizes must be a batchfit.BatchSizes, got int (64); pass "
                "sizes=batchfit.BatchSizes(max_batch_size=64)."
            ),
        ),
        (
            "trials",
            3,
            (
                "BatchfitTrainer's trials must be a batchfit.Trials, got int (3); pass "
                "trials=batchfit.Trials(steps_per_trial=3)."
            ),
        ),
        (
            "memory_limit",
            2.5,
            (
                'BatchfitTrainer\'s memory_limit must be a size such as "8GiB" or a number of bytes (int), '
                "got float (2.5); "
                'pass memory_limit="8GiB" (or memory_limit=8 * 2**30).'
            ),
        ),
        (
            "memory_fraction",
            "0.8",
            (
                "BatchfitTrainer's memory_fraction must be a number in (0, 1], got str ('0.8'); pass "
                "memory_fraction=0.8."
            ),
        ),
        (
            "device",
            0,
            (
                "BatchfitTrainer's device must be a device name or a torch.device, got int (0); pass "
                'device="cuda:0" (or '
                'device=torch.device("cuda", 0)).'
            ),
        ),
    ],
)
def test_a_keyword_of_the_wrong_type_is_named_when_the_trainer_is_made(
    tmp_path: Path, keyword: str, value: Any, message: str
) -> None:
    args = arguments(tmp_path)
    with pytest.raises(ArgumentTypeError) as raised:
        BatchfitTrainer(model=torch.nn.Linear(2, 2), args=args, **{keyword: value})
    assert str(raised.value) == message
    assert isinstance(raised.value, TypeError) and isinstance(raised.value, batchfit.BatchfitError)

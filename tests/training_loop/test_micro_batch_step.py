"""MicroBatchStep reaches the full batch's weights, through real out-of-memory retries under a real cap;
its errors, exactly."""

from __future__ import annotations

import collections
import copy
import dataclasses
import logging
import re
from collections.abc import Callable
from typing import Any

import pytest
import torch
from micro_batch_helpers import (
    accumulation_peak_bytes,
    adam,
    backward_oom_cap,
    full_batch_step,
    make_batch,
    make_model,
    step_peak_bytes,
)
from torch import nn

import batchfit
from batchfit import MicroBatchOptions, MicroBatchStep
from batchfit.errors import ConfigurationError, DoesNotFitError, OptimizerStepOutOfMemoryError
from batchfit.policy.plan.micro_batch import MicroBatchChange
from batchfit.runtime.steps.micro_batches import plain

cross_entropy = nn.functional.cross_entropy


def assert_same_weights(model: nn.Module, reference: nn.Module) -> None:
    for (name, param), ref, init in zip(
        model.named_parameters(), reference.parameters(), make_model().parameters(), strict=True
    ):
        torch.testing.assert_close(param, ref, atol=1e-13, rtol=1e-11, msg=name)
        assert not torch.allclose(ref, init), f"{name} did not move: the comparison would prove nothing"


def sgd(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)


def adamw(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)


def warmup(optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: (step + 1) / 3)


@pytest.mark.parametrize("make_optimizer", [sgd, adamw])
@pytest.mark.parametrize("micro_batch_size", [32, 7, 100, 1])
def test_steps_equal_full_batch_steps(
    make_optimizer: Callable[[nn.Module], torch.optim.Optimizer], micro_batch_size: int
) -> None:
    """100 samples as 32+32+32+4 (or 14 x 7 + 2, one of 100, 100 of 1): the same weights and losses as
    whole-batch steps, over 3 steps with a warm-up schedule."""
    batches = [make_batch(100, seed) for seed in range(3)]
    reference, model = make_model(), make_model()
    ref_optimizer = make_optimizer(reference)
    ref_scheduler = warmup(ref_optimizer)
    expected = [
        full_batch_step(reference, ref_optimizer, batch, scheduler=ref_scheduler) for batch in batches
    ]

    optimizer = make_optimizer(model)
    step = MicroBatchStep(
        model,
        optimizer,
        loss_fn=cross_entropy,
        micro_batch_size=micro_batch_size,
        scheduler=warmup(optimizer),
    )
    losses = [step(batch) for batch in batches]

    for loss, want in zip(losses, expected, strict=True):
        assert loss.requires_grad is False
        torch.testing.assert_close(loss, want, atol=1e-14, rtol=1e-13)
    assert_same_weights(model, reference)
    assert step.optimizer_steps == 3 and step.history == ()
    assert all(param.grad is None for param in model.parameters())
    assert optimizer.param_groups[0]["lr"] == ref_optimizer.param_groups[0]["lr"]


def test_clipping_and_grad_scaler_see_the_whole_batch() -> None:
    batch = make_batch(50)
    reference, model = make_model(), make_model()
    ref_scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    full_batch_step(reference, sgd(reference), batch, scaler=ref_scaler, max_grad_norm=0.05)

    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    step = MicroBatchStep(
        model,
        sgd(model),
        loss_fn=cross_entropy,
        micro_batch_size=16,
        scaler=scaler,
        options=MicroBatchOptions(max_grad_norm=0.05),
    )
    step(batch)
    assert_same_weights(model, reference)
    assert scaler.state_dict() == ref_scaler.state_dict()


def test_a_custom_loss_and_a_dict_batch_split_along_batch_dim() -> None:
    """compute_loss(model, micro_batch) on a dict batch with samples along dim 1 and a non-tensor leaf."""
    inputs, targets = make_batch(30)
    batch = {"inputs": inputs.T, "targets": targets[None], "temperature": 2.0}
    seen: list[int] = []

    def compute_loss(model: nn.Module, micro_batch: dict[str, Any]) -> torch.Tensor:
        seen.append(micro_batch["inputs"].shape[1])
        logits = model(micro_batch["inputs"].T) / micro_batch["temperature"]
        return cross_entropy(logits, micro_batch["targets"][0])

    reference, model = make_model(), make_model()
    ref_optimizer = adam(reference)
    ref_optimizer.zero_grad()
    cross_entropy(reference(inputs) / 2.0, targets).backward()
    ref_optimizer.step()

    step = MicroBatchStep(
        model,
        adam(model),
        compute_loss=compute_loss,
        micro_batch_size=8,
        options=MicroBatchOptions(batch_dim=1),
    )
    step(batch)
    assert seen == [8, 8, 8, 6]
    assert_same_weights(model, reference)

    # A mapping that is not a dict (Hugging Face's BatchEncoding, from its tokenizers and data
    # collators) is cut the same way: it held "no tensors" before.
    again = make_model()
    step = MicroBatchStep(
        again,
        adam(again),
        compute_loss=compute_loss,
        micro_batch_size=8,
        options=MicroBatchOptions(batch_dim=1),
    )
    step(collections.UserDict(batch))
    assert seen[4:] == [8, 8, 8, 6]
    assert_same_weights(again, reference)


def optimizer_steps_taken(optimizer: torch.optim.Optimizer) -> list[float]:
    return [float(state["step"]) for state in optimizer.state.values()]


def test_an_out_of_memory_in_backward_halves_and_reruns_the_same_batch(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Under a real cap micro-batch 64 runs out of memory in backward and 32 fits: the batch runs again
    at 32, and the weights, the optimizer's and scheduler's counts and the GradScaler are those of one
    full-batch step."""
    batch = make_batch(200)
    cap = backward_oom_cap(batch, fails=64, fits=32)
    reference, model = make_model(), make_model()
    ref_optimizer = adam(reference)
    ref_scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=2)  # a 2nd update doubles
    full_batch_step(reference, ref_optimizer, batch, scaler=ref_scaler, scheduler=warmup(ref_optimizer))

    optimizer = adam(model)
    scheduler = warmup(optimizer)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=2)
    step = MicroBatchStep(
        model, optimizer, loss_fn=cross_entropy, micro_batch_size=64, scaler=scaler, scheduler=scheduler
    )
    with (
        caplog.at_level(logging.WARNING, logger="batchfit"),
        batchfit.cap_memory(cap, resident=[model, optimizer]),
    ):
        loss = step(batch)

    assert step.micro_batch_size == 32
    assert step.history == (MicroBatchChange(0, 64, 32, "out of memory in backward"),)
    assert caplog.messages == [
        "MicroBatchStep: micro_batch_size 64 -> 32 at optimizer step 0: out of memory in backward."
    ]
    assert_same_weights(model, reference)
    torch.testing.assert_close(loss, cross_entropy(make_model()(batch[0]), batch[1]), atol=1e-14, rtol=1e-13)
    assert optimizer_steps_taken(optimizer) == optimizer_steps_taken(ref_optimizer) == [1.0] * 4
    assert scheduler.last_epoch == 1 and step.optimizer_steps == 1
    assert scaler.state_dict() == ref_scaler.state_dict()
    assert scaler.get_scale() == 2.0**8


def test_grows_back_after_clean_steps_and_keeps_the_history() -> None:
    """Shrunk to 32 in step 0 under the cap, then two clean steps without it: step 3 runs at 64 again,
    and all four steps equal full-batch steps."""
    batches = [make_batch(200, seed) for seed in range(4)]
    cap = backward_oom_cap(batches[0], fails=64, fits=32)
    reference, model = make_model(), make_model()
    ref_optimizer = sgd(reference)
    for batch in batches:
        full_batch_step(reference, ref_optimizer, batch)

    optimizer = sgd(model)
    step = MicroBatchStep(
        model, optimizer, loss_fn=cross_entropy, micro_batch_size=64, options=MicroBatchOptions(grow_after=2)
    )
    with batchfit.cap_memory(cap, resident=[model, optimizer]):
        step(batches[0])
    sizes = [step.micro_batch_size]
    for batch in batches[1:]:
        step(batch)
        sizes.append(step.micro_batch_size)

    assert sizes == [32, 32, 64, 64]
    assert [change.to_dict() for change in step.history] == [
        {"optimizer_step": 0, "old_micro_batch_size": 64, "new_micro_batch_size": 32,
         "reason": "out of memory in backward"},
        {"optimizer_step": 3, "old_micro_batch_size": 32, "new_micro_batch_size": 64,
         "reason": "grew back after 2 clean steps"},
    ]  # fmt: skip
    assert_same_weights(model, reference)


def test_an_error_that_is_not_an_out_of_memory_propagates_unchanged() -> None:
    """A bug in the third micro-batch: the same exception object, no gradients left, nothing stepped."""
    model = make_model()
    optimizer = adam(model)
    scheduler = warmup(optimizer)
    before = copy.deepcopy(model.state_dict())
    bug = ValueError("a bug in the loss")
    calls: list[int] = []

    def compute_loss(model: nn.Module, micro_batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        calls.append(len(micro_batch[1]))
        if len(calls) == 3:
            raise bug
        return cross_entropy(model(micro_batch[0]), micro_batch[1])

    step = MicroBatchStep(
        model, optimizer, compute_loss=compute_loss, micro_batch_size=10, scheduler=scheduler
    )
    with pytest.raises(ValueError) as raised:
        step(make_batch(40))
    assert raised.value is bug and calls == [10, 10, 10]
    assert all(param.grad is None for param in model.parameters())
    assert all(torch.equal(value, before[name]) for name, value in model.state_dict().items())
    assert (step.optimizer_steps, scheduler.last_epoch, len(optimizer.state), step.history) == (0, 0, 0, ())


def test_out_of_memory_at_one_sample_says_what_to_do() -> None:
    """A cap that holds the weights and nothing more: 4 -> 2 -> 1, then DoesNotFitError."""
    model = make_model()
    optimizer = sgd(model)
    cap = sum(param.numel() * param.element_size() for param in model.parameters())
    step = MicroBatchStep(model, optimizer, loss_fn=cross_entropy, micro_batch_size=4)
    batch = make_batch(10)
    prefix = (
        "out of memory in forward at micro_batch_size 1 (optimizer step 0): not even one sample fits beside "
        "the weights, gradients and optimizer state. Lower the memory of a sample (shorter sequences, "
        "smaller images, activation checkpointing, mixed precision) or of the model, or use a device with "
        "more memory. The optimizer did not step and the batch's gradients were dropped. The out-of-memory: "
        "OutOfMemoryError: out of memory: DefaultCPUAllocator: can't allocate memory: you tried to allocate "
    )
    with (
        pytest.raises(DoesNotFitError, match=f"^{re.escape(prefix)}") as raised,
        batchfit.cap_memory(cap, resident=[model, optimizer]),
    ):
        step(batch)
    assert not isinstance(raised.value, OptimizerStepOutOfMemoryError)
    assert [(change.old_micro_batch_size, change.new_micro_batch_size) for change in step.history] == [
        (4, 2),
        (2, 1),
    ]
    assert all(param.grad is None for param in model.parameters()) and step.optimizer_steps == 0


def test_an_out_of_memory_in_the_optimizer_step_is_not_retried() -> None:
    """Adam's first step creates its state past the cap, after the forwards and backwards fit. The
    optimizer had begun to change its state: MicroBatchStep raises, it does not step again."""
    batch = make_batch(12)
    accumulation, whole = accumulation_peak_bytes(batch, 4), step_peak_bytes(batch, 4)
    assert accumulation < whole
    model = make_model()
    optimizer = adam(model)
    scheduler = warmup(optimizer)
    step = MicroBatchStep(model, optimizer, loss_fn=cross_entropy, micro_batch_size=4, scheduler=scheduler)
    prefix = (
        "out of memory in the optimizer step (optimizer step 0, micro_batch_size 4): OutOfMemoryError: "
        "out of memory: DefaultCPUAllocator: can't allocate memory: you tried to allocate "
    )
    suffix = (
        "The optimizer may have updated part of the parameters and of its state before it failed, so "
        "MicroBatchStep does not run the step again (that would apply part of it twice), and a smaller "
        "micro-batch would not lower this memory (the activations are freed by then). Load the last "
        "checkpoint and lower the optimizer's memory: foreach=False (one parameter at a time, fewer "
        "temporaries), an optimizer with less state, or a device with more memory."
    )
    with (
        pytest.raises(OptimizerStepOutOfMemoryError) as raised,
        batchfit.cap_memory((accumulation + whole) // 2, resident=[model, optimizer]),
    ):
        step(batch)
    message = str(raised.value)
    assert message.startswith(prefix) and message.endswith(suffix), message
    assert isinstance(raised.value, DoesNotFitError) and isinstance(
        raised.value.__cause__, torch.OutOfMemoryError
    )
    assert len(optimizer.state) > 0  # the optimizer had begun: running it again would not be the same step
    assert (step.history, step.micro_batch_size, step.optimizer_steps, scheduler.last_epoch) == ((), 4, 0, 0)
    assert all(param.grad is None for param in model.parameters())


def _model_and_optimizer() -> tuple[nn.Module, torch.optim.Optimizer]:
    model = make_model()
    return model, sgd(model)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"micro_batch_size": 0},
            (
                "micro_batch_size (0) must be a whole number of samples, 1 or more: the largest micro-batch "
                "to run, halved after each out-of-memory."
            ),
        ),
        (
            {"micro_batch_size": 8, "grow_after": 0},
            (
                "grow_after (0) must be a whole number of optimizer steps, 1 or more; None never grows the "
                "micro-batch back."
            ),
        ),
        (
            {"micro_batch_size": 8, "max_grad_norm": 0.0},
            "max_grad_norm (0.0) must be positive; None does not clip.",
        ),
        (
            {"micro_batch_size": 8, "batch_dim": -1},
            "batch_dim (-1) must be 0 or more: the dimension of the batch's tensors that holds the samples.",
        ),
        (
            {"micro_batch_size": 8, "compute_loss": lambda model, batch: model(batch).sum()},
            (
                "pass loss_fn or compute_loss, not both: compute_loss(model, micro_batch) computes the loss "
                "itself, loss_fn(model(inputs), target) on a batch (inputs, target)."
            ),
        ),
        (
            {"micro_batch_size": 8, "loss_fn": "cross_entropy", "compute_loss": None},
            (
                "loss_fn must be callable, got str; pass loss_fn(output, target) -> a scalar loss, such as "
                "torch.nn.functional.cross_entropy or nn.CrossEntropyLoss()."
            ),
        ),
        (
            {"micro_batch_size": 8, "loss_fn": None, "compute_loss": "loss"},
            "compute_loss must be callable, got str; pass compute_loss(model, micro_batch) -> a scalar loss.",
        ),
        (
            {"micro_batch_size": "64"},
            (
                "micro_batch_size ('64') must be a whole number of samples, 1 or more: the largest "
                "micro-batch to run, halved after each out-of-memory."
            ),
        ),
        (
            {"micro_batch_size": 8, "max_grad_norm": "1.0"},
            (
                "max_grad_norm must be a number or None, got str ('1.0'); pass the norm to clip the "
                "gradients to, such as 1.0, or None not to clip."
            ),
        ),
        (
            {"micro_batch_size": 8, "scaler": True},
            (
                "scaler must be a torch.amp.GradScaler or None, got bool; pass the GradScaler that scales "
                "your float16 training, or None."
            ),
        ),
        (
            {"micro_batch_size": 8, "scheduler": "cosine"},
            (
                "scheduler must be a torch.optim.lr_scheduler.LRScheduler or None, got str; pass the "
                "scheduler of the optimizer, stepped once per optimizer step, or None."
            ),
        ),
        (
            {"micro_batch_size": 8, "noise_monitor": 100},
            (
                "noise_monitor must be a batchfit.policy.plan.noise_monitor.NoiseScaleMonitor or None, "
                "got int; "
                "pass NoiseScaleMonitor(every=100) to log the gradient noise scale, or None."
            ),
        ),
        (
            {"micro_batch_size": 8, "non_finite": "ignore"},
            (
                "non_finite ('ignore') must be 'raise' (a NonFiniteError when a loss or gradient is NaN or "
                "inf) or 'skip' (drop that step's gradients and step nothing, as a GradScaler does)."
            ),
        ),
        (
            {"micro_batch_size": 8, "reduction": "batchmean"},
            (
                "reduction ('batchmean') must be 'mean' (the loss is a mean over the micro-batch's samples), "
                "'sum' (a sum over them), 'token_mean' (a mean over the target's elements that are not "
                "ignore_index) or None (read it from a loss module, else 'mean')."
            ),
        ),
        (
            {"micro_batch_size": 8, "reduction": "token_mean", "ignore_index": -100.0},
            (
                "ignore_index must be an int, got float (-100.0); pass the target value the loss skips "
                "(-100 for torch's cross_entropy), or None."
            ),
        ),
        (
            {"micro_batch_size": 8, "ignore_index": 0},
            (
                "ignore_index (0) counts only with reduction='token_mean', not 'mean'; pass "
                "reduction='token_mean' if the loss is a mean over the non-ignored target elements."
            ),
        ),
        (
            {"micro_batch_size": 8, "loss_fn": nn.CrossEntropyLoss(reduction="none")},
            (
                "loss_fn is CrossEntropyLoss(reduction='none'): it returns one loss per element, and "
                "MicroBatchStep backpropagates a scalar; pass reduction='mean' or 'sum' to the loss module."
            ),
        ),
        (
            {"micro_batch_size": 8, "loss_fn": nn.CrossEntropyLoss(weight=torch.ones(4))},
            (
                "loss_fn is CrossEntropyLoss(reduction='mean') with class weights: its mean divides by the "
                "sum of the weights of the batch's targets, which no split of the batch into micro-batches "
                "keeps. Use reduction='sum' and divide by that sum yourself in compute_loss, or drop weight."
            ),
        ),
        (
            {"micro_batch_size": 8, "loss_fn": nn.CrossEntropyLoss(reduction="sum"), "reduction": "mean"},
            (
                "reduction='mean' disagrees with loss_fn, CrossEntropyLoss(reduction='sum'); the loss "
                "module's reduction is what its loss is: drop reduction, or change the module's."
            ),
        ),
        (
            {"micro_batch_size": 8, "loss_fn": nn.MSELoss(), "reduction": "token_mean"},
            (
                "reduction='token_mean' needs a loss that skips a target value, and loss_fn, "
                "MSELoss(reduction='mean'), has no ignore_index; drop reduction, or pass a loss that has one."
            ),
        ),
        (
            {"micro_batch_size": 8, "loss_fn": nn.CrossEntropyLoss(ignore_index=0), "ignore_index": -100},
            (
                "ignore_index=-100 disagrees with loss_fn, CrossEntropyLoss(reduction='mean', "
                "ignore_index=0); drop ignore_index, or set it on the loss module."
            ),
        ),
    ],
)  # fmt: skip
def test_bad_arguments_name_the_parameter(kwargs: dict[str, Any], message: str) -> None:
    arguments = {"loss_fn": cross_entropy, **kwargs}
    fields = {field.name for field in dataclasses.fields(MicroBatchOptions)}
    options = {name: arguments.pop(name) for name in list(arguments) if name in fields}
    with pytest.raises(ConfigurationError, match=f"^{re.escape(message)}$") as raised:
        MicroBatchStep(*_model_and_optimizer(), **arguments, options=MicroBatchOptions(**options))
    assert isinstance(raised.value, ValueError)


def test_a_model_and_an_optimizer_are_required() -> None:
    model, optimizer = _model_and_optimizer()
    with pytest.raises(
        ConfigurationError,
        match=r"^model must be a torch\.nn\.Module, got function; pass the module you train \(under DDP, its "
        r"DistributedDataParallel wrapper\)\.$",
    ):
        MicroBatchStep(lambda x: x, optimizer, micro_batch_size=8)  # type: ignore[arg-type]
    with pytest.raises(
        ConfigurationError,
        match=r"^optimizer must be a torch.optim.Optimizer, got list; MicroBatchStep steps it once per "
        r"call\.$",
    ):
        MicroBatchStep(model, [optimizer], micro_batch_size=8)  # type: ignore[arg-type]
    with pytest.raises(
        ConfigurationError,
        match=r"^MicroBatchStep steps the optimizer once on the gradients its "
        r"micro-batches accumulated, but LBFGS\.step needs a closure",
    ):
        MicroBatchStep(model, torch.optim.LBFGS(model.parameters()), micro_batch_size=8)
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer)
    with pytest.raises(
        ConfigurationError,
        match=r"^scheduler is a ReduceLROnPlateau, whose step needs the metric it watches, and "
        r"MicroBatchStep steps its scheduler without arguments after each optimizer step; pass "
        r"scheduler=None and call "
        r"scheduler\.step\(metric\) yourself\.$",
    ):
        MicroBatchStep(model, optimizer, micro_batch_size=8, scheduler=plateau)


@pytest.mark.parametrize(
    ("batch", "loss_fn", "message"),
    [
        (
            (torch.zeros(6, 16, dtype=torch.float64), torch.zeros(5, dtype=torch.long)),
            cross_entropy,
            (
                "the batch's tensors hold different numbers of samples along batch_dim=0 (shapes (6, 16), "
                "(5,)); each tensor must have the same size there, so every micro-batch gets matching slices."
            ),
        ),
        (
            ([1.0, 2.0], [0, 1]),
            cross_entropy,
            (
                "the batch (tuple) holds no tensors; MicroBatchStep splits a batch's tensors along "
                "batch_dim, so pass tensors in tuples, lists or dicts."
            ),
        ),
        (
            (torch.zeros(0, 16, dtype=torch.float64), torch.zeros(0, dtype=torch.long)),
            cross_entropy,
            "the batch holds no samples (size 0 along batch_dim=0); skip empty batches.",
        ),
        (
            (torch.zeros(6, 16, dtype=torch.float64), torch.tensor(3)),
            cross_entropy,
            (
                "a tensor of the batch has shape (), with no dimension batch_dim=0; every tensor of the "
                "batch must have its samples along batch_dim (a value shared by all samples goes in a "
                "non-tensor leaf, such as a float)."
            ),
        ),
        (
            make_batch(6),
            lambda output, target: nn.functional.cross_entropy(output, target, reduction="none"),
            (
                "loss_fn returned a tensor of shape (6,), not a scalar loss; it must return one loss for the "
                "micro-batch, reduced as reduction says ('mean', the default): MicroBatchStep weights it so "
                "that the micro-batches add up to the full batch's loss."
            ),
        ),
        (
            {"inputs": torch.zeros(6, 16, dtype=torch.float64), "targets": torch.zeros(6, dtype=torch.long)},
            "token_mean",
            (
                "reduction='token_mean' counts the target's elements that are not ignore_index, but the "
                "batch (dict) is neither a pair (inputs, target) nor a mapping with a 'labels' tensor; put "
                "the target there, or divide the loss's sum by the batch's token count yourself in "
                "compute_loss and pass reduction='sum'."
            ),
        ),
    ],
)  # fmt: skip
def test_bad_batches_and_losses_are_explained(batch: Any, loss_fn: Any, message: str) -> None:
    model, optimizer = _model_and_optimizer()
    if loss_fn == "token_mean":
        step = MicroBatchStep(
            model,
            optimizer,
            compute_loss=lambda model, batch: 0,
            micro_batch_size=8,
            options=MicroBatchOptions(reduction="token_mean"),
        )
    else:
        step = MicroBatchStep(model, optimizer, loss_fn=loss_fn, micro_batch_size=8)
    with pytest.raises(ConfigurationError, match=f"^{re.escape(message)}$"):
        step(batch)
    assert all(param.grad is None for param in model.parameters()) and step.optimizer_steps == 0


def test_plain_keeps_a_pytree_and_opens_every_other_mapping() -> None:
    tensor = torch.zeros(2)
    batch = ({"a": tensor}, [tensor, 1.0], tensor)
    assert plain(batch) is batch  # nothing to open: the same object
    opened = plain([collections.UserDict({"a": tensor, "b": collections.UserDict({"c": tensor})})])
    assert type(opened) is list and type(opened[0]) is dict and type(opened[0]["b"]) is dict
    assert opened[0]["a"] is tensor and opened[0]["b"]["c"] is tensor

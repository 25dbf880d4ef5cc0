"""Which step the default measures, on a Hugging Face model built from a config: the default
drops the model's outputs before backward; a loop that keeps them (``outputs = model(**batch);
outputs.loss.backward()``) holds the logits through backward, and needs its own ``train_step``.
Each answer is the truth for its own loop, by force under the same cap."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import batchfit
from batchfit import BatchSizes, Workload, find_batch_size
from batchfit.units import parse_bytes

transformers = pytest.importorskip("transformers")

LIMIT = "24MiB"
VOCAB, SEQUENCE = 4096, 64  # logits of 4096 x 64 floats a sample (1 MiB): what a kept output holds


def gpt2() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=VOCAB, n_positions=SEQUENCE, n_embd=32, n_layer=1, n_head=2, bos_token_id=0, eos_token_id=0
    )
    return transformers.GPT2LMHeadModel(config)


def make_batch(n: int) -> dict[str, torch.Tensor]:
    ids = torch.randint(0, VOCAB, (n, SEQUENCE), generator=torch.Generator().manual_seed(n))
    return {"input_ids": ids, "labels": ids}


def kept_outputs_step(model: torch.nn.Module, optimizer: Any, batch: Any) -> None:
    """The Hugging Face "no_trainer" loop: ``outputs`` lives until the step ends."""
    outputs = model(**batch)
    loss = outputs.loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()


def default_step(model: torch.nn.Module, optimizer: Any, batch: Any) -> None:
    """What the default measures: the loss kept, the outputs dropped before backward."""
    loss = model(**batch).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()


def trains(step: Any, batch_size: int) -> bool:
    """Two real steps of ``step`` on a fresh model under the cap: the truth by force."""
    model = gpt2()
    optimizer = torch.optim.AdamW(model.parameters())
    budget = int(0.8 * parse_bytes(LIMIT))
    try:
        with batchfit.cap_memory(budget, resident=[model, optimizer]):
            for _ in range(2):
                step(model, optimizer, make_batch(batch_size))
    except torch.OutOfMemoryError:
        return False
    return True


@pytest.mark.parametrize(("loop", "train_step"), [("default", None), ("kept outputs", kept_outputs_step)])
def test_each_answer_is_the_truth_for_its_own_loop(loop: str, train_step: Any) -> None:
    model = gpt2()
    workload = Workload(
        model, torch.optim.AdamW(model.parameters()), make_batch=make_batch, train_step=train_step
    )
    answer = find_batch_size(workload, device="cpu", memory_limit=LIMIT, sizes=BatchSizes(max_batch_size=64))
    truth_step = default_step if train_step is None else kept_outputs_step
    assert answer.stop_reason == "boundary", loop
    assert trains(truth_step, answer.batch_size) and not trains(truth_step, answer.batch_size + 1), loop


def test_keeping_the_outputs_costs_batch() -> None:
    def answer(train_step: Any) -> int:
        model = gpt2()
        workload = Workload(
            model, torch.optim.AdamW(model.parameters()), make_batch=make_batch, train_step=train_step
        )
        sizes = BatchSizes(max_batch_size=64)
        return find_batch_size(workload, device="cpu", memory_limit=LIMIT, sizes=sizes).batch_size

    assert answer(kept_outputs_step) < answer(None)

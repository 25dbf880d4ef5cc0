"""Tiny Hugging Face models built from configs (no download), their datasets and collators, for the
Trainer adapter's tests and its torchrun script."""

from __future__ import annotations

from typing import Any

import torch
from transformers import BertConfig, BertForSequenceClassification, GPT2Config, GPT2LMHeadModel

VOCAB = 256


def gpt2() -> GPT2LMHeadModel:
    """A 2-layer GPT-2 (40k parameters), without dropout: runs that see the same samples agree."""
    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=2,
        n_head=2,
        n_embd=32,
        vocab_size=VOCAB,
        n_positions=32,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=0,
    )
    return GPT2LMHeadModel(config)


def bert() -> BertForSequenceClassification:
    """A 2-layer BERT classifier, without dropout."""
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=48,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        num_labels=2,
    )
    return BertForSequenceClassification(config)


def token_examples(count: int, lengths: tuple[int, ...] = (32,), seed: int = 0) -> list[dict[str, Any]]:
    """``count`` examples of token ids, their lengths cycling through ``lengths``: every batch the
    sequential sampler takes holds each length, so is padded to the longest and holds padding."""
    generator = torch.Generator().manual_seed(seed)
    sizes = [lengths[index % len(lengths)] for index in range(count)]
    return [
        {"input_ids": torch.randint(0, VOCAB, (size,), generator=generator).tolist(), "label": index % 2}
        for index, size in enumerate(sizes)
    ]


def language_modelling(examples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """Examples of one length as a causal language model trains on them: the ids are the labels."""
    ids = torch.tensor([example["input_ids"] for example in examples])
    return {"input_ids": ids, "labels": ids.clone()}


def padded(examples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """Examples of any length padded to the batch's longest, with their class labels."""
    longest = max(len(example["input_ids"]) for example in examples)
    ids = torch.zeros(len(examples), longest, dtype=torch.long)
    mask = torch.zeros(len(examples), longest, dtype=torch.long)
    for row, example in enumerate(examples):
        ids[row, : len(example["input_ids"])] = torch.tensor(example["input_ids"])
        mask[row, : len(example["input_ids"])] = 1
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "labels": torch.tensor([example["label"] for example in examples]),
    }

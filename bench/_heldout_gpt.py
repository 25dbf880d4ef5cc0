"""A small GPT that no rule of batchfit was tuned on, for the timing verbs' minutes
(``bench/verb_minutes.py --workload heldout-gpt``): pre-norm blocks with their own causal attention
(``scaled_dot_product_attention``), a GELU MLP, a head tied to the embedding, AdamW with weight decay;
token sequences drawn at random (the step's cost, not what it learns, is measured).

    batchfit advise --workload _heldout_gpt:gpt --device cpu --memory-limit 256MiB  # bench/ on PYTHONPATH
"""

from __future__ import annotations

import torch
from torch import nn

from batchfit import Workload

VOCAB, SEQ_LEN, WIDTH, HEADS, LAYERS = 1024, 64, 128, 4, 3


class Block(nn.Module):
    """One pre-norm transformer block: causal self-attention, then a GELU MLP, each residual."""

    def __init__(self) -> None:
        super().__init__()
        self.attention_norm, self.mlp_norm = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.qkv, self.out = nn.Linear(WIDTH, 3 * WIDTH), nn.Linear(WIDTH, WIDTH)
        self.mlp = nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        batch, length, _ = hidden.shape
        q, k, v = self.qkv(self.attention_norm(hidden)).split(WIDTH, dim=-1)
        q, k, v = (part.view(batch, length, HEADS, -1).transpose(1, 2) for part in (q, k, v))
        attended = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        hidden = hidden + self.out(attended.transpose(1, 2).reshape(batch, length, WIDTH))
        mlp: torch.Tensor = self.mlp(self.mlp_norm(hidden))
        return hidden + mlp


class GPT(nn.Module):
    """Token ids (batch, seq) -> logits (batch, seq, vocab)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.position = nn.Parameter(torch.zeros(SEQ_LEN, WIDTH))
        self.blocks = nn.Sequential(*(Block() for _ in range(LAYERS)))
        self.norm = nn.LayerNorm(WIDTH)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden: torch.Tensor = self.blocks(self.embed(tokens) + self.position[: tokens.shape[1]])
        logits: torch.Tensor = self.norm(hidden) @ self.embed.weight.T
        return logits


def gpt(device: torch.device) -> Workload:
    """The held-out GPT on ``device``, AdamW (weight decay 0.1), counting tokens."""
    torch.manual_seed(0)
    model = GPT().to(device)

    def make_batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = torch.randint(0, VOCAB, (n, SEQ_LEN + 1), generator=torch.Generator().manual_seed(n))
        return tokens[:, :-1], tokens[:, 1:]

    def loss_fn(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), target.reshape(-1))

    return Workload(
        model=model,
        optimizer=torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1),
        make_batch=make_batch,
        loss_fn=loss_fn,
        tokens_per_sample=SEQ_LEN,
        name="heldout-gpt",
    )

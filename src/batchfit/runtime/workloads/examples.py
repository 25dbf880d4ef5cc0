"""Built-in workloads in pure torch, small enough for a CPU and needing no download."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from batchfit.errors import ConfigurationError
from batchfit.runtime.devices.resolve import parse_device
from batchfit.runtime.workloads.workload import Workload


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def mlp(device: torch.device) -> Workload:
    """A 784-1024-1024-10 perceptron on random 'images' with Adam."""
    model = nn.Sequential(
        nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10)
    ).to(device)

    def make_batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        gen = _generator(n)
        return torch.randn(n, 784, generator=gen), torch.randint(0, 10, (n,), generator=gen)

    return Workload(
        model=model,
        optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
        make_batch=make_batch,
        loss_fn=nn.functional.cross_entropy,
        name="mlp",
    )


def cnn(device: torch.device) -> Workload:
    """A small BatchNorm CNN on 3x32x32 images (CIFAR-sized) with SGD and momentum."""

    def block(cin: int, cout: int) -> nn.Sequential:
        return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU())

    model = nn.Sequential(
        block(3, 32),
        block(32, 64),
        nn.MaxPool2d(2),
        block(64, 128),
        nn.MaxPool2d(2),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(128, 10),
    ).to(device)

    def make_batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        gen = _generator(n)
        return torch.randn(n, 3, 32, 32, generator=gen), torch.randint(0, 10, (n,), generator=gen)

    return Workload(
        model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        make_batch=make_batch,
        loss_fn=nn.functional.cross_entropy,
        name="cnn",
    )


class TinyLM(nn.Module):
    """A causal transformer language model: token ids (batch, seq) -> logits (batch, seq, vocab)."""

    def __init__(self, vocab: int = 512, seq_len: int = 128, width: int = 64, layers: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.position = nn.Parameter(torch.zeros(seq_len, width))
        layer = nn.TransformerEncoderLayer(width, nhead=4, dim_feedforward=4 * width, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(width, vocab)
        self.register_buffer(
            "mask", nn.Transformer.generate_square_subsequent_mask(seq_len), persistent=False
        )

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        length = tokens.shape[1]
        hidden = self.embed(tokens) + self.position[:length]
        mask = self.get_buffer("mask")
        hidden = self.encoder(hidden, mask=mask[:length, :length], is_causal=True)
        return self.head(hidden)  # type: ignore[no-any-return]


def transformer(device: torch.device, vocab: int = 512, seq_len: int = 128) -> Workload:
    """A 2-layer causal transformer LM on random token sequences with AdamW."""
    model = TinyLM(vocab=vocab, seq_len=seq_len).to(device)

    def make_batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = torch.randint(0, vocab, (n, seq_len + 1), generator=_generator(n))
        return tokens[:, :-1], tokens[:, 1:]

    def loss_fn(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))

    return Workload(
        model=model,
        optimizer=torch.optim.AdamW(model.parameters(), lr=3e-4),
        make_batch=make_batch,
        loss_fn=loss_fn,
        tokens_per_sample=seq_len,
        name="transformer",
    )


EXAMPLES: dict[str, Callable[[torch.device], Workload]] = {
    "mlp": mlp,
    "cnn": cnn,
    "transformer": transformer,
}


def build_example(name: str, device: str | torch.device | None = None) -> Workload:
    """A fresh built-in workload on ``device`` (default: cuda if available, else cpu, as for the
    search); its weights are seeded (the same on every device), and the caller's RNG is left
    untouched. Its batches are made on the host and copied to the device by each step."""
    if name not in EXAMPLES:
        raise ConfigurationError(f"unknown example {name!r}: choose one of {', '.join(sorted(EXAMPLES))}.")
    target = parse_device(device)
    # The weights are drawn on the host, then moved: only the CPU generator is seeded (and put
    # back). torch.manual_seed would also seed, or queue a seed for, every CUDA device.
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(0)
        return EXAMPLES[name](target)

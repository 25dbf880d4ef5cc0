"""Shared tiny real workloads for the tests: ``from tiny_workloads import build``. A plain module,
not conftest.py: tests/report has a conftest of its own, and ``from conftest import`` would get
whichever conftest was imported last."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from batchfit import Event, Workload
from batchfit.policy.search.trial import Trial
from batchfit.progress import OnProgress


def tiny_mlp(width: int = 256) -> nn.Module:
    return nn.Sequential(
        nn.Linear(64, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10)
    )


def tiny_cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Dropout(0.1),
        nn.Linear(32, 10),
    )


def classification_batch(shape: tuple[int, ...]) -> Callable[[int], tuple[torch.Tensor, torch.Tensor]]:
    def make_batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(n)
        return torch.randn(n, *shape, generator=gen), torch.randint(0, 10, (n,), generator=gen)

    return make_batch


def build(kind: str, optimizer: str = "adam") -> Workload:
    torch.manual_seed(0)
    model = tiny_mlp() if kind == "mlp" else tiny_cnn()
    shape = (64,) if kind == "mlp" else (3, 16, 16)
    opt: torch.optim.Optimizer = (
        torch.optim.Adam(model.parameters(), lr=1e-2)
        if optimizer == "adam"
        else torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    )
    return Workload(
        model=model,
        optimizer=opt,
        make_batch=classification_batch(shape),
        loss_fn=nn.functional.cross_entropy,
        name=kind,
    )


def untraceable(kind: str, optimizer: str = "sgd") -> Workload:
    """A workload whose step reads a value (.item()): no fake-tensor forecast, every trial real."""
    workload = build(kind, optimizer)

    def train_step(model: nn.Module, opt: torch.optim.Optimizer, batch: tuple[torch.Tensor, ...]) -> None:
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(batch[0]), batch[1])
        loss.backward()
        opt.step()
        workload.losses.append(loss.item())  # type: ignore[attr-defined]  # data-dependent

    workload.losses = []  # type: ignore[attr-defined]
    workload.train_step = train_step
    return workload


def skipping_workload(skipped: int, device: str | torch.device = "cpu") -> Workload:
    """An MLP with Adam whose step skips ``optimizer.step`` its first ``skipped`` times for each
    optimizer (as a GradScaler does while the scale is too large): Adam's state is created late.
    On ``device``."""
    torch.manual_seed(0)
    width = 1024  # Adam's state (8.8 MB) is what does not fit
    model = nn.Sequential(
        nn.Linear(64, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10)
    ).to(device)
    calls: dict[int, int] = {}

    def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, batch: Any) -> None:
        optimizer.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(batch[0]), batch[1]).backward()
        calls[id(optimizer)] = calls.get(id(optimizer), 0) + 1
        if calls[id(optimizer)] > skipped:
            optimizer.step()

    return Workload(
        model=model,
        optimizer=lambda parameters: torch.optim.Adam(parameters, lr=1e-3),
        make_batch=classification_batch((64,)),
        train_step=train_step,
    )


def overflowing_workload(loss_scale: float) -> Workload:
    """The tiny MLP with Adam, trained in float16 autocast with a GradScaler, its loss multiplied by
    ``loss_scale``: from a fresh scaler's 65536, 1e3 overflows the first 7 steps (each skipped,
    the scale halved), as large models' first fp16 steps do; 1 overflows none."""
    return float16_scaled(build("mlp", "adam"), torch.amp.GradScaler("cpu"), loss_scale)


def float16_scaled(workload: Workload, scaler: torch.amp.GradScaler, loss_scale: float = 1.0) -> Workload:
    """``workload`` trained in float16 autocast with ``scaler``, as mixed-precision training is,
    its cross-entropy loss multiplied by ``loss_scale``."""

    def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, batch: Any) -> None:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.float16):
            loss = nn.functional.cross_entropy(model(batch[0]), batch[1])
            loss = loss * loss_scale if loss_scale != 1.0 else loss
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()

    workload.train_step = train_step
    return workload


def large_batch_workspace(per_sample: int, small: bool = False) -> Workload:
    """An MLP whose step, from 64 samples up (``small``: below 64 only), makes and frees at once a
    workspace of ``per_sample`` bytes a sample amid its activations: a kernel's algorithm that only
    large (or small) batches take, so the other batches' allocator requests do not show it."""
    torch.manual_seed(0)
    width = 300
    model = nn.Sequential(
        nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10)
    )

    def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, batch: Any) -> None:
        optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(batch[0]), batch[1])
        if (len(batch[0]) < 64) == small:
            torch.empty(len(batch[0]) * per_sample, dtype=torch.uint8).zero_()
        loss.backward()
        optimizer.step()

    optimizer = torch.optim.Adam(model.parameters())
    return Workload(model, optimizer, make_batch=classification_batch((width,)), train_step=train_step)


def segment_crossing(dataset: bool = False) -> Workload:
    """Two 1024-wide layers whose activations (4 KiB a sample) cross 10 MiB at 2,560 samples: below,
    CUDA's caching allocator puts two of them in one 20 MiB segment; above, each takes a segment of
    its own rounded to 2 MiB. Under a 60 MiB cap that allocator fits every size up to 2,048 and from
    2,560 to 3,072, not 2,049-2,559: which sizes fit is not monotone. ``dataset``: batches from a
    map-style dataset of 4,096 samples (whose last batch can be any size) instead of ``make_batch``."""
    torch.manual_seed(0)
    width = 1024
    model = nn.Sequential(nn.Linear(width, width, bias=False), nn.ReLU(), nn.Linear(width, 10, bias=False))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    if not dataset:
        return Workload(
            model, optimizer, make_batch=classification_batch((width,)), loss_fn=nn.functional.cross_entropy
        )
    inputs, targets = classification_batch((width,))(4096)
    samples = torch.utils.data.TensorDataset(inputs, targets)
    return Workload(model, optimizer, dataset=samples, loss_fn=nn.functional.cross_entropy)


def lbfgs_mlp() -> Workload:
    """The tiny MLP trained by L-BFGS for three steps: its history of directions is full."""
    torch.manual_seed(0)
    workload = build("mlp", "sgd")
    optimizer = torch.optim.LBFGS(workload.model.parameters(), history_size=4, max_iter=3)
    workload.optimizer = optimizer
    inputs, target = classification_batch((64,))(8)
    for _ in range(3):
        workload.run_train_step(optimizer, (inputs, target))
    return workload


def sparse_embedding_workload() -> Workload:
    """A bag of embeddings with a sparse gradient (a recommender's lookup table), trained by SGD."""
    torch.manual_seed(0)

    class Bag(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.table = nn.Embedding(5000, 32, sparse=True)
            self.head = nn.Linear(32, 4)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.head(self.table(ids).mean(1))

    def make_batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(n)
        return torch.randint(0, 5000, (n, 20), generator=generator), torch.randint(
            0, 4, (n,), generator=generator
        )

    model = Bag()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    return Workload(model, optimizer, make_batch=make_batch, loss_fn=nn.functional.cross_entropy)


class QueueModel(nn.Module):
    """A linear head beside a queue of the last 4096 inputs (1 MiB, as contrastive methods keep
    negatives), a buffer the forward assigns anew: training frees the old one at each step."""

    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(64, 10)
        self.register_buffer("queue", torch.zeros(4096, 64))

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        if self.training:
            self.queue = torch.cat([self.queue[inputs.shape[0] :], inputs.detach()])
        return self.head(inputs)


def queue_workload() -> Workload:
    torch.manual_seed(0)
    model = QueueModel()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    return Workload(
        model, optimizer, make_batch=classification_batch((64,)), loss_fn=nn.functional.cross_entropy
    )


def adversarial(seed: int = 0, device: str = "cpu") -> tuple[Workload, dict[str, Any]]:
    """A generator trained against a discriminator with its own Adam, and an EMA copy of the
    generator: a step that changes state beside the workload's model and optimizer, and holds
    memory beside them. Returns the workload and that other state."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10)).to(device)
    optimizer = torch.optim.Adam(model.parameters())
    critic = nn.Sequential(nn.Linear(10, 512), nn.ReLU(), nn.Linear(512, 1)).to(device)
    critic_optimizer = torch.optim.Adam(critic.parameters())
    averaged = torch.optim.swa_utils.get_ema_multi_avg_fn(0.999)
    ema = torch.optim.swa_utils.AveragedModel(model, multi_avg_fn=averaged)

    def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, batch: Any) -> None:
        inputs, target = batch
        output = model(inputs)
        loss = nn.functional.cross_entropy(output, target) + critic(output).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        critic_optimizer.zero_grad()
        critic(output.detach()).mean().backward()
        critic_optimizer.step()
        critic_optimizer.zero_grad()
        ema.update_parameters(model)

    workload = Workload(model, optimizer, make_batch=classification_batch((64,)), train_step=train_step)
    return workload, {"critic": critic, "critic_optimizer": critic_optimizer, "ema": ema}


def as_in_ddp(workload: Workload) -> Workload:
    """``workload`` as one process searches it in DistributedDataParallel: beside the model, in every
    trial, a buffer its loss reaches holds the bytes of DDP's gradient buckets (a gradient's bytes
    per parameter). The single-process answer that ranks searching the DDP must agree with."""
    buckets = sum(p.numel() * p.element_size() for p in workload.model.parameters() if p.requires_grad)
    holder = nn.Module()
    holder.register_buffer("buckets", torch.empty(buckets, dtype=torch.uint8))
    loss = workload.loss_fn
    assert loss is not None

    def loss_fn(output: torch.Tensor, target: torch.Tensor, holder: nn.Module = holder) -> torch.Tensor:
        return loss(output, target)

    return dataclasses.replace(workload, loss_fn=loss_fn)


def trials_into(heard: list[Trial]) -> OnProgress:
    """A progress callback that keeps every trial that ended, in order."""

    def hear(event: Event) -> None:
        if event.stage == "trial" and event.trial is not None:
            heard.append(event.trial)

    return hear


def blocks_cnn(width: int = 8, side: int = 16) -> Workload:
    """The built-in ``cnn`` example's shape (three conv-BatchNorm-ReLU blocks, each a Sequential,
    SGD with momentum) at ``width`` channels in its first block (the example has 32) on 3 x
    ``side`` x ``side`` images (the example's are 32): what mixed precision and checkpointing buy
    shows on it as on the example, at a fraction of the example's work a step. Without bfloat16
    kernels (oneDNN capped below AVX512-BF16) an autocast step is about 20x a float32 one, so the
    tests that train it under autocast use this and not the example."""
    torch.manual_seed(0)

    def block(cin: int, cout: int) -> nn.Sequential:
        return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU())

    model = nn.Sequential(
        block(3, width),
        block(width, 2 * width),
        nn.MaxPool2d(2),
        block(2 * width, 4 * width),
        nn.MaxPool2d(2),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(4 * width, 10),
    )
    return Workload(
        model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        make_batch=classification_batch((3, side, side)),
        loss_fn=nn.functional.cross_entropy,
        name="blocks-cnn",
    )

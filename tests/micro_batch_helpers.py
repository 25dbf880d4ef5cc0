"""A tiny float64 model, its batches, the plain full-batch step MicroBatchStep must equal, and memory
caps measured (not guessed) for the out-of-memory tests, alone and under DDP."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

import batchfit
from batchfit import MicroBatchStep

Batch = tuple[torch.Tensor, torch.Tensor]
OptimizerFactory = Callable[[nn.Module], torch.optim.Optimizer]


def make_model() -> nn.Module:
    """Small weights, wide activations: a micro-batch's memory is mostly activations. No BatchNorm or
    dropout, so each sample's gradient is independent of the others."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 128), nn.Tanh(), nn.Linear(128, 4)).double()


def adam(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.Adam(model.parameters(), lr=1e-2)


def make_batch(samples: int, seed: int = 0) -> Batch:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(samples, 16, generator=gen, dtype=torch.float64), torch.randint(
        0, 4, (samples,), generator=gen
    )


def full_batch_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: Batch,
    *,
    scaler: torch.amp.GradScaler | None = None,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
    max_grad_norm: float | None = None,
) -> torch.Tensor:
    """The step MicroBatchStep must reproduce: the whole batch in one forward and backward."""
    optimizer.zero_grad(set_to_none=True)
    loss = nn.functional.cross_entropy(model(batch[0]), batch[1])
    (scaler.scale(loss) if scaler is not None else loss).backward()
    if max_grad_norm is not None:
        if scaler is not None:
            scaler.unscale_(optimizer)
        assert nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm) > max_grad_norm  # it clips
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    if scheduler is not None:
        scheduler.step()
    return loss.detach()


def step_peak_bytes(batch: Batch, micro_batch_size: int, make_optimizer: OptimizerFactory = adam) -> int:
    """The peak of one MicroBatchStep call on a fresh model, counting its weights and optimizer."""
    model = make_model()
    optimizer = make_optimizer(model)
    step = MicroBatchStep(
        model, optimizer, loss_fn=nn.functional.cross_entropy, micro_batch_size=micro_batch_size
    )
    with batchfit.cap_memory("1GiB", resident=[model, optimizer]) as measured:
        step(batch)
    return measured.peak_bytes


def accumulation_peak_bytes(
    batch: Batch, micro_batch_size: int, make_optimizer: OptimizerFactory = adam
) -> int:
    """The peak of the forwards and backwards of one step (no optimizer step), gradients kept."""
    model = make_model()
    optimizer = make_optimizer(model)
    with batchfit.cap_memory("1GiB", resident=[model, optimizer]) as measured:
        for inputs, target in zip(
            batch[0].split(micro_batch_size), batch[1].split(micro_batch_size), strict=True
        ):
            loss = nn.functional.cross_entropy(model(inputs), target) * (len(target) / len(batch[1]))
            loss.backward()
    return measured.peak_bytes


def forward_peak_bytes(batch: Batch, micro_batch_size: int, make_optimizer: OptimizerFactory = adam) -> int:
    """The peak of one forward of ``micro_batch_size`` samples once the gradients exist (a later
    micro-batch's forward, the largest one)."""
    model = make_model()
    optimizer = make_optimizer(model)
    nn.functional.cross_entropy(model(batch[0][:1]), batch[1][:1]).backward()
    with batchfit.cap_memory("1GiB", resident=[model, optimizer]) as measured:
        inputs, target = batch[0][:micro_batch_size], batch[1][:micro_batch_size]
        nn.functional.cross_entropy(model(inputs), target) * (micro_batch_size / len(batch[1]))
    return measured.peak_bytes


def backward_oom_cap(batch: Batch, fails: int, fits: int) -> int:
    """A cap under which a step at micro-batch ``fails`` runs out of memory in a backward (its
    forwards fit) and a step at ``fits`` fits: midway between what the two need."""
    below = max(step_peak_bytes(batch, fits), forward_peak_bytes(batch, fails))
    above = step_peak_bytes(batch, fails)
    assert below < above, f"no cap between {below} and {above} bytes: the model does not suit the test"
    return (below + above) // 2


class ClassesFirst(nn.Module):
    """(samples, tokens, classes) logits as cross-entropy takes them: (samples, classes, tokens)."""

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        return logits.transpose(1, 2)


def make_token_model() -> nn.Module:
    """A per-token classifier over sequences of 16-feature tokens; tokens are independent."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4), ClassesFirst()).double()


def make_token_batch(samples: int, tokens: int = 6, seed: int = 0) -> Batch:
    """Sequences of 0 to ``tokens`` tokens, padded; the padding's targets are -100 (ignored)."""
    gen = torch.Generator().manual_seed(seed)
    inputs = torch.randn(samples, tokens, 16, generator=gen, dtype=torch.float64)
    targets = torch.randint(0, 4, (samples, tokens), generator=gen)
    lengths = torch.randint(0, tokens + 1, (samples,), generator=gen)
    lengths[1] = 0  # a sequence with nothing to count: micro-batches of 1 meet one
    return inputs, targets.masked_fill(torch.arange(tokens) >= lengths[:, None], -100)


def users_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: Batch,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The user's own step: the whole batch in one forward with their loss, backward, step. Its
    loss and the gradients the optimizer stepped on."""
    optimizer.zero_grad(set_to_none=True)
    loss = loss_fn(model(batch[0]), batch[1])
    loss.backward()
    gradients = [param.grad.clone() for param in model.parameters() if param.grad is not None]
    optimizer.step()
    return loss.detach(), gradients


def stepped_gradients(optimizer: torch.optim.Optimizer) -> list[list[torch.Tensor]]:
    """Filled, at each ``optimizer.step``, with the gradients it steps on (a copy)."""
    seen: list[list[torch.Tensor]] = []

    def keep(optimizer: torch.optim.Optimizer, args: object, kwargs: object) -> None:
        params = [param for group in optimizer.param_groups for param in group["params"]]
        seen.append([param.grad.clone() for param in params if param.grad is not None])

    optimizer.register_step_pre_hook(keep)
    return seen


def assert_same_step(
    model: nn.Module,
    reference: nn.Module,
    initial: nn.Module,
    gradients: list[torch.Tensor],
    expected: list[torch.Tensor],
) -> None:
    """The gradients stepped on and the parameters after the step agree to 1e-10 (relative), and
    the step moved every parameter."""
    assert len(gradients) == len(expected) > 0
    for grad, want in zip(gradients, expected, strict=True):
        torch.testing.assert_close(grad, want, rtol=1e-10, atol=1e-13)
    for (name, param), ref, init in zip(
        model.named_parameters(), reference.parameters(), initial.parameters(), strict=True
    ):
        torch.testing.assert_close(param, ref, rtol=1e-10, atol=1e-13)
        assert not torch.allclose(ref, init), f"{name} did not move: the comparison would prove nothing"


def sgd_plain(model: nn.Module) -> torch.optim.Optimizer:
    """SGD without momentum or decay: one step moves each parameter by lr x its gradient."""
    return torch.optim.SGD(model.parameters(), lr=0.1)

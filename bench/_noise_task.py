"""The task of ``bench/noise_prediction.py``: a small MLP learning a noisy linear teacher's classes
with plain SGD, one seed's run at one batch size and rate (replayable from a copy), and the step at
which its held-out loss first reaches a target."""

from __future__ import annotations

import copy
import math

import torch
from torch import nn

FEATURES, HIDDEN, CLASSES = 32, 128, 10
LABEL_NOISE = 0.2
TEACHER_SCALE = 6.0  # the teacher's logits: sharp enough that the floor is well below the start
HELD_OUT = 16384
EVALUATE_EVERY = 16  # steps between held-out evaluations; a crossing is then found step by step


class Task:
    """The teacher, the feature scales and the one held-out set every run is judged on."""

    def __init__(self) -> None:
        generator = torch.Generator().manual_seed(0)
        self.scales = torch.logspace(0, -1, FEATURES)
        weights = torch.randn(FEATURES, CLASSES, generator=generator) / math.sqrt(FEATURES)
        self.teacher = TEACHER_SCALE * weights / self.scales[:, None]  # it sees the unscaled features
        self.held_out = self.draw(HELD_OUT, torch.Generator().manual_seed(1))

    def draw(self, samples: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        inputs = torch.randn(samples, FEATURES, generator=generator) * self.scales
        labels = (inputs @ self.teacher).softmax(dim=1).multinomial(1, generator=generator).squeeze(1)
        noisy = torch.rand(samples, generator=generator) < LABEL_NOISE
        random_labels = torch.randint(0, CLASSES, (samples,), generator=generator)
        return inputs, torch.where(noisy, random_labels, labels)

    def loss(self, model: nn.Module) -> float:
        with torch.no_grad():
            return float(nn.functional.cross_entropy(model(self.held_out[0]), self.held_out[1]))


def student(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, CLASSES))


class Run:
    """One seed's SGD run at one batch size and learning rate; its batches come from its own
    generator, so a copy of (weights, generator) replays it exactly."""

    def __init__(self, task: Task, seed: int, batch_size: int, learning_rate: float) -> None:
        self.task, self.batch_size, self.learning_rate = task, batch_size, learning_rate
        self.model, self.steps = student(seed), 0
        self.generator = torch.Generator().manual_seed(10_000 + seed)

    def step(self) -> None:
        inputs, labels = self.task.draw(self.batch_size, self.generator)
        self.model.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(self.model(inputs), labels).backward()
        with torch.no_grad():
            for parameter in self.model.parameters():
                if parameter.grad is not None:
                    parameter.add_(parameter.grad, alpha=-self.learning_rate)
        self.steps += 1

    def saved(self) -> tuple[dict[str, torch.Tensor], torch.Tensor, int]:
        return copy.deepcopy(self.model.state_dict()), self.generator.get_state(), self.steps

    def restore(self, saved: tuple[dict[str, torch.Tensor], torch.Tensor, int]) -> None:
        self.model.load_state_dict(saved[0])
        self.generator.set_state(saved[1])
        self.steps = saved[2]


def steps_to_target(run: Run, target: float, max_steps: int) -> int | None:
    """The first step after which the held-out loss is at most ``target`` (None: not by
    ``max_steps``, or diverged). Evaluated every ``EVALUATE_EVERY`` steps; the steps between the
    last evaluation above the target and the first at or below it are replayed one at a time."""
    start = run.task.loss(run.model)
    while run.steps < max_steps:
        saved = run.saved()
        for _ in range(min(EVALUATE_EVERY, max_steps - run.steps)):
            run.step()
        loss = run.task.loss(run.model)
        if not math.isfinite(loss) or loss > start + 1.0:
            return None  # diverged
        if loss <= target:
            run.restore(saved)
            while run.task.loss(run.model) > target:
                run.step()
            return run.steps
    return None

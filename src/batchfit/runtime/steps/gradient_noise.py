"""Reading the gradient noise scale's squared norms from training as it runs, on one device:
``AccumulationNoise`` reads each micro-batch's gradient against the step's accumulated gradient
(``policy.noise.noise_scale.GradientReading``, one per optimizer step). Under DDP the pair is one rank's
gradient against the all-reduced one instead: ``runtime.distributed.gradient_noise``.

Per optimizer step of ``k`` micro-batches of ``micro_batch_size`` samples::

    noise = AccumulationNoise(model.parameters(), micro_batch_size, scaler=scaler)
    optimizer.zero_grad()
    for micro in micro_batches:                 # k of them, the same size
        scaler.scale(loss_fn(model, micro) / k).backward()
        noise.after_backward()
    reading = noise.end_step()                  # before unscale_, clipping and optimizer.step
    scaler.step(optimizer); scaler.update()
    ...
    noise.estimate()                            # policy.noise.noise_scale.NoiseScale over the readings

``end_step`` reads the device once per step; ``after_backward`` only queues work on it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import torch

from batchfit.errors import ConfigurationError
from batchfit.policy.noise.noise_scale import GradientReading, NoiseScale, estimate


def squared_norm(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """The squared norm of ``tensors`` taken as one vector: a float64 scalar on their device (the
    first one's), not read."""
    if not tensors:
        return torch.zeros((), dtype=torch.float64)
    norms = torch._foreach_norm(list(tensors))
    on = tensors[0].device
    return torch.stack([norm.to(on, torch.float64) for norm in norms]).square().sum()


def scale_of(scaler: torch.amp.GradScaler | None) -> float:
    """What the gradients are multiplied by: the GradScaler's scale (1 without one, or disabled)."""
    return float(scaler.get_scale()) if scaler is not None and scaler.is_enabled() else 1.0


def reading_of(
    small_batch_size: int, big_batch_size: int, small_norm_sq: float, big_norm_sq: float, scale: float
) -> GradientReading | None:
    """The step's reading, the scale's square divided out of both squared norms; None where they are
    not finite (a step a GradScaler skips for overflow, or gradients that overflowed)."""
    small, big = small_norm_sq / scale**2, big_norm_sq / scale**2
    if not (math.isfinite(small) and math.isfinite(big)):
        return None
    return GradientReading(small_batch_size, big_batch_size, small, big)


def trained_parameters(parameters: Iterable[torch.nn.Parameter]) -> list[torch.nn.Parameter]:
    """The parameters that require a gradient; a ConfigurationError where there are none."""
    trained = [parameter for parameter in parameters if parameter.requires_grad]
    if not trained:
        raise ConfigurationError(
            "no parameter requires a gradient (every one is frozen), so there is no gradient to read "
            "the noise scale from; unfreeze the parameters the run trains (requires_grad=True)."
        )
    return trained


class ReadingLog:
    """The readings a reader has taken, one per optimizer step, and the steps it skipped because
    their gradients were not finite (a GradScaler's overflow)."""

    def __init__(self) -> None:
        self.readings: list[GradientReading] = []
        self.skipped = 0

    def keep(self, reading: GradientReading | None) -> GradientReading | None:
        """Log ``reading`` (None: a skipped step) and hand it back."""
        if reading is None:
            self.skipped += 1
        else:
            self.readings.append(reading)
        return reading

    def estimate(self) -> NoiseScale:
        """The noise scale over the readings so far (``policy.noise.noise_scale.estimate``)."""
        return estimate(self.readings)


class AccumulationNoise(ReadingLog):
    """Reads one ``GradientReading`` per optimizer step from gradient accumulation on one device:
    small is the mean over the step's micro-batches of each one's gradient's squared norm, big is
    the squared norm of their mean (the accumulated gradient).

    A micro-batch's own gradient is what its backward added to the accumulated one, so it keeps one
    copy of the gradients (the accumulated gradient before the backward), made at the first step
    and held from then on: at most one extra copy, whatever the number of micro-batches.

    ``loss_divided``: each micro-batch's loss is divided by the step's number of micro-batches before
    its backward (as ``MicroBatchStep``, Lightning and Hugging Face do), so the gradients add up to
    the mean gradient; False: they add up to that many times it (each micro-batch's mean loss
    backpropagated as it is). Either way both norms are of the mean-reduced loss's gradient. Every
    micro-batch of a step must hold ``micro_batch_size`` samples. With ``scaler``, the gradients
    are its scale times the loss's, and the scale's square is divided out; a step whose gradients
    are not finite (one the scaler skips) gives no reading and counts in ``skipped``.
    """

    def __init__(
        self,
        parameters: Iterable[torch.nn.Parameter],
        micro_batch_size: int,
        *,
        scaler: torch.amp.GradScaler | None = None,
        loss_divided: bool = True,
    ) -> None:
        if micro_batch_size < 1:
            raise ConfigurationError(f"micro_batch_size must be a positive integer, got {micro_batch_size}.")
        self.parameters = trained_parameters(parameters)
        self.micro_batch_size, self.scaler, self.loss_divided = micro_batch_size, scaler, loss_divided
        super().__init__()
        self.micro_batches = 0  # this step's, so far
        # The accumulated gradient before the current micro-batch's backward (the one extra copy).
        self._previous: list[torch.Tensor | None] = [None] * len(self.parameters)
        self._micro_norm_sq: torch.Tensor | None = None  # the sum over this step's micro-batches

    def after_backward(self) -> None:
        """Call after each micro-batch's backward: reads what it added to the gradients."""
        first = self.micro_batches == 0
        added: list[torch.Tensor] = []
        for index, parameter in enumerate(self.parameters):
            grad, previous = parameter.grad, self._previous[index]
            if grad is None:
                if first and previous is not None:
                    previous.zero_()  # the step starts from no gradient
                continue
            if grad.is_sparse:
                raise ConfigurationError(
                    f"parameter {index} has a sparse gradient; the noise scale reads dense gradients "
                    f"only (use sparse=False in nn.Embedding)."
                )
            if previous is None or first:
                # A step's first backward adds all there is (the step starts from zeroed gradients).
                added.append(grad.detach())
                if previous is None:
                    self._previous[index] = grad.detach().clone()
                else:
                    previous.copy_(grad)
            else:
                previous.sub_(grad)  # minus what this backward added, in the copy
                added.append(previous)
        if not added:
            raise ConfigurationError(
                "no parameter holds a gradient after the backward; call after_backward() after "
                "loss.backward(), on the parameters the loss depends on."
            )
        norm_sq = squared_norm(added)
        self._micro_norm_sq = norm_sq if self._micro_norm_sq is None else self._micro_norm_sq + norm_sq
        if not first:
            for index, parameter in enumerate(self.parameters):
                previous = self._previous[index]
                if parameter.grad is not None and previous is not None:
                    previous.copy_(parameter.grad)
        self.micro_batches += 1

    def end_step(self) -> GradientReading | None:
        """Call after the step's last backward, before anything changes the gradients (a GradScaler's
        ``unscale_``, clipping, the optimizer's step, ``zero_grad``): the step's reading, also kept in
        ``readings``; None for a step whose gradients are not finite."""
        count, micro = self.micro_batches, self._micro_norm_sq
        if count < 2 or micro is None:
            raise ConfigurationError(
                f"the step ran {count} micro-batch(es); the noise scale compares a micro-batch with "
                f"their accumulated batch, so each step needs at least 2 (call after_backward() after "
                f"each micro-batch's backward, end_step() once per optimizer step)."
            )
        self.micro_batches, self._micro_norm_sq = 0, None
        grads = [parameter.grad.detach() for parameter in self.parameters if parameter.grad is not None]
        micro_sum, big = torch.stack([micro, squared_norm(grads).to(micro.device)]).tolist()
        if self.loss_divided:  # each backward added 1/count of its micro-batch's gradient
            small = micro_sum * count
        else:  # each added its micro-batch's gradient: the accumulation is count times the mean
            small, big = micro_sum / count, big / count**2
        micro_batch_size, scale = self.micro_batch_size, scale_of(self.scaler)
        return self.keep(reading_of(micro_batch_size, micro_batch_size * count, small, big, scale))

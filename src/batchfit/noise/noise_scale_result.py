"""What ``noise_scale`` returns: the estimate of ``B_simple`` with its interval, the readings it rests
on (one per optimizer step) and the batch sizes that made them, as text and JSON."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, ClassVar

from batchfit.policy.noise.noise_scale import GradientReading, NoiseScale
from batchfit.result import stamped


@dataclass(frozen=True)
class NoiseScaleResult:
    """The noise scale (``estimate``: ``B_simple``, its 90% interval, ``|G|^2`` and ``tr(Sigma)``)
    and the readings it rests on, one per optimizer step, with the batch sizes that made them."""

    estimate: NoiseScale
    readings: tuple[GradientReading, ...]
    batch_size: int  # the big batch: one optimizer step's samples, over every rank
    micro_batch_size: int  # samples per forward on each device
    accumulation_steps: int
    world_size: int
    fixed_weights: bool  # read at the weights as found, without optimizer steps between readings
    device: str
    seconds: float

    command: ClassVar[str] = "noise-scale"

    @property
    def b_simple(self) -> float:
        return self.estimate.b_simple

    def summary(self) -> str:
        """One line: the estimate, its interval and what it rests on."""
        scale = self.estimate
        if not scale.resolved:
            return f"B_simple not resolved: {scale.meaning()}"
        interval = (
            "" if scale.low is None or scale.high is None else f" (90%: {scale.low:.4g}-{scale.high:.4g})"
        )
        return (
            f"B_simple = {scale.b_simple:.4g}{interval} from {scale.steps} steps, batch "
            f"{scale.big_batch_size} against {scale.small_batch_size}"
        )

    def table(self) -> str:
        """The result as the command line prints it."""
        scale = self.estimate
        low = "-" if scale.low is None else f"{scale.low:.4g}"
        high = "-" if scale.high is None else f"{scale.high:.4g}"
        weights = "fixed weights" if self.fixed_weights else "training"
        lines = [
            f"B_simple          {scale.b_simple:.4g}" if scale.resolved else "B_simple          not resolved",
            f"90% interval      {low} to {high}",
            f"steps             {scale.steps} ({weights})",
            f"batch sizes       {scale.big_batch_size} against {scale.small_batch_size}",
            f"|G|^2             {scale.gradient_norm_sq:.4g}",
            f"tr(Sigma)         {scale.trace_sigma:.4g}",
            f"meaning           {scale.meaning()}",
        ]
        return "\n".join(lines) + "\n"

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"

    def to_dict(self) -> dict[str, Any]:
        data = {
            "noise_scale": self.estimate.to_dict(),
            "readings": [
                {"small_norm_sq": reading.small_norm_sq, "big_norm_sq": reading.big_norm_sq}
                for reading in self.readings
            ],
            "batch_size": self.batch_size,
            "micro_batch_size": self.micro_batch_size,
            "accumulation_steps": self.accumulation_steps,
            "world_size": self.world_size,
            "fixed_weights": self.fixed_weights,
            "device": self.device,
            "seconds": self.seconds,
        }
        return stamped(self.command, data)

"""How far the global batch can grow before scaling stops paying, by the gradient noise scale, free
of torch (McCandlish et al. 2018, arXiv 1812.06162): a target takes ``S(B) = S_min (1 + B_noise / B)``
optimizer steps and ``E(B) = E_min (1 + B / B_noise)`` samples. Well below ``B_noise`` a k times
larger batch takes about k times fewer steps; near it, a doubled batch cuts the steps by a quarter
and costs half as many samples again; well above it, the steps barely fall and the samples are spent.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from batchfit.policy.noise.goodput import noise_scale_of
from batchfit.policy.noise.noise_scale import NoiseScale

#: A global batch this many times the noise scale or more is warned of: a doubled batch there cuts
#: the steps by a tenth or less, and each sample does a fifth of its small-batch work or less.
FAR_ABOVE_NOISE_SCALE = 4


@dataclass(frozen=True)
class ScalingPayoff:
    """What going from ``base_batch_size`` to ``global_batch_size`` buys at the noise scale: the
    steps to a target (``steps_ratio``, against ``base / global`` in proportion) and the samples."""

    noise_scale: float  # B_noise in samples; inf where the noise hid the signal (unresolved)
    noise_scale_low: float | None
    noise_scale_high: float | None
    base_batch_size: int
    global_batch_size: int
    steps_ratio: float  # S(global) / S(base)
    samples_ratio: float  # E(global) / E(base)

    @property
    def proportional_steps_ratio(self) -> float:
        """The steps ratio if the steps fell in proportion to the batch: ``base / global``."""
        return self.base_batch_size / self.global_batch_size

    @property
    def times_noise_scale(self) -> float:
        """The global batch over the noise scale (0 when the noise scale is unresolved)."""
        return self.global_batch_size / self.noise_scale

    def lines(self, scaling_rule: str, learning_rate_scale: float) -> list[str]:
        """The summary's lines: the steps and samples, and, under the linear rule, the learning rate
        the noise scale's model gives SGD against the rule's."""
        base, target = self.base_batch_size, self.global_batch_size
        if not math.isfinite(self.noise_scale):
            return [
                (
                    f"noise_scale unresolved: from base_batch_size {base} to global_batch_size {target} "
                    f"the steps are taken to fall in proportion ({self.steps_ratio:.2f}x) at no extra "
                    "samples; measure the noise scale at larger batches to know where that stops"
                )
            ]
        interval = ""
        if self.noise_scale_low is not None and self.noise_scale_high is not None:
            interval = f" [{self.noise_scale_low:.0f}, {self.noise_scale_high:.0f}]"
        lines = [
            (
                f"noise_scale {self.noise_scale:g}{interval}: from base_batch_size {base} to "
                f"global_batch_size {target} the steps to a target fall to {self.steps_ratio:.2f}x (in "
                f"proportion: {self.proportional_steps_ratio:.2f}x) and the samples grow to "
                f"{self.samples_ratio:.2f}x; scaling pays up to about {self.noise_scale:.0f} samples per "
                "step (beyond it a doubled batch cuts the steps by under a quarter)"
            )
        ]
        if scaling_rule == "linear" and target != base:
            best = 1 / self.steps_ratio
            lines.append(
                f"for SGD the same model puts the best learning rate at {best:.2f}x base_learning_rate, "
                f"against the linear rule's {learning_rate_scale:g}x (McCandlish et al. 2018: it grows "
                "as 1 / (1 + B_noise / B), levelling off above the noise scale)"
            )
        return lines

    def warning(self) -> str | None:
        """A warning when the global batch is far above the noise scale; None otherwise."""
        times = self.times_noise_scale
        if times < FAR_ABOVE_NOISE_SCALE:
            return None
        target, noise = self.global_batch_size, self.noise_scale
        doubled = (2 * target + noise) / (2 * target + 2 * noise)  # S(2B) / S(B)
        limit = FAR_ABOVE_NOISE_SCALE * noise
        return (
            f"global_batch_size {target} is {times:.1f}x the noise scale ({noise:g}): a target takes "
            f"{1 + noise / target:.2f}x the fewest steps any batch can, a doubled batch would cut them "
            f"by only {1 - doubled:.0%}, and it spends {1 + target / noise:.1f}x the fewest samples; a "
            f"global batch of {limit:.0f} or less ({FAR_ABOVE_NOISE_SCALE}x the noise scale) takes few "
            f"more steps on far fewer samples."
        )

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["noise_scale"] = self.noise_scale if math.isfinite(self.noise_scale) else None
        return data


def scaling_payoff(
    global_batch_size: int, base_batch_size: int, noise_scale: NoiseScale | float
) -> ScalingPayoff:
    """The steps and samples to a target at ``global_batch_size`` over those at ``base_batch_size``,
    at ``noise_scale`` (a measured ``NoiseScale`` or a number of samples)."""
    value, low, high = noise_scale_of(noise_scale)
    # (1 + n / B) / (1 + n / B0) and (1 + B / n) / (1 + B0 / n), finite as n grows without bound
    spread = (global_batch_size / value + 1) / (base_batch_size / value + 1)
    steps = spread * base_batch_size / global_batch_size
    return ScalingPayoff(value, low, high, base_batch_size, global_batch_size, steps, spread)

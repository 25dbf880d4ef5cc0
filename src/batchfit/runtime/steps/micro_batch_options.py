"""``MicroBatchOptions``: how a ``MicroBatchStep`` runs beyond its model, optimizer, loss and
micro-batch: clipping, growing the micro-batch back, the batch's dimension, the loss's reduction,
what a loss or gradient that is not finite does, and the noise-scale monitor it feeds."""

from __future__ import annotations

from dataclasses import dataclass

from batchfit.errors import ArgumentTypeError, ConfigurationError
from batchfit.policy.plan.noise_monitor import NoiseScaleMonitor
from batchfit.runtime.steps.micro_batch_finite import NON_FINITE, NonFinite
from batchfit.runtime.steps.micro_batch_reduction import Reduction


@dataclass(frozen=True)
class MicroBatchOptions:
    """The settings of a ``MicroBatchStep``; the defaults fit most loops::

    step = MicroBatchStep(model, optimizer, F.cross_entropy, micro_batch_size=64,
                          options=MicroBatchOptions(grow_after=100, max_grad_norm=1.0))
    """

    grow_after: int | None = None
    """Double the micro-batch after this many optimizer steps in a row without an out-of-memory, up
    to ``micro_batch_size``; None never grows it back."""
    max_grad_norm: float | None = None
    """Clip the accumulated gradients' norm to this before the optimizer step; None does not clip."""
    batch_dim: int = 0
    """The dimension of the batch's tensors that holds the samples."""
    reduction: Reduction | None = None
    """What one micro-batch's loss is, so its weight: "mean" over its n_i of the batch's N samples
    (weight n_i / N), "sum" over them (weight 1), "token_mean" over the t_i elements of its target
    that are not ``ignore_index`` (weight t_i / T, T the batch's; the target is a pair's second
    element or a mapping's "labels", and a micro-batch with none runs no backward). None reads it
    from a torch loss module ``loss_fn`` (``nn.CrossEntropyLoss(reduction="sum")``), else the mean."""
    ignore_index: int | None = None
    """token_mean: the target value that is not counted (-100 for torch's cross-entropy)."""
    non_finite: NonFinite = "raise"
    """A loss or gradient that is not finite: "raise" a NonFiniteError, or "skip" the step."""
    noise_monitor: NoiseScaleMonitor | None = None
    """Reads the gradient noise scale each optimizer step; the step's ``noise_scale`` is its latest."""

    def __post_init__(self) -> None:
        norm = self.max_grad_norm
        if norm is not None and (isinstance(norm, bool) or not isinstance(norm, (int, float))):
            raise ArgumentTypeError(
                f"max_grad_norm must be a number or None, got {type(norm).__name__} ({norm!r}); pass the "
                f"norm to clip the gradients to, such as 1.0, or None not to clip."
            )
        if norm is not None and not norm > 0:
            raise ConfigurationError(f"max_grad_norm ({norm}) must be positive; None does not clip.")
        dim = self.batch_dim
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 0:
            raise ConfigurationError(
                f"batch_dim ({dim!r}) must be 0 or more: the dimension of the batch's tensors that holds "
                f"the samples."
            )
        if self.non_finite not in NON_FINITE:
            raise ConfigurationError(
                f"non_finite ({self.non_finite!r}) must be 'raise' (a NonFiniteError when a loss or "
                f"gradient is NaN or inf) or 'skip' (drop that step's gradients and step nothing, as a "
                f"GradScaler does)."
            )
        monitor = self.noise_monitor
        if monitor is not None and not isinstance(monitor, NoiseScaleMonitor):
            raise ConfigurationError(
                f"noise_monitor must be a batchfit.policy.plan.noise_monitor.NoiseScaleMonitor or None, got "
                f"{type(monitor).__name__}; pass NoiseScaleMonitor(every=100) to log the gradient noise "
                f"scale, or None."
            )

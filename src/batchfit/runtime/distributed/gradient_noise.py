"""Reading the gradient noise scale's squared norms from a ``DistributedDataParallel`` model's own
all-reduce: ``DataParallelNoise`` pairs each rank's gradient (its local batch) with the all-reduced
one (the global batch), one ``GradientReading`` per optimizer step, the same on every rank.

    model = DistributedDataParallel(module)
    noise = DataParallelNoise(model, local_batch_size, scaler=scaler)  # registers its comm hook
    for batch in loader:                          # each rank its own local batch
        scaler.scale(loss_fn(model, batch)).backward()   # the all-reduce that synchronises
        noise.end_step()                          # every rank; before unscale_ and optimizer.step
        scaler.step(optimizer); scaler.update(); optimizer.zero_grad()

Accumulation under ``no_sync()`` is fine: the hook runs at the backward that synchronises, when
each rank's buckets hold its accumulated gradient (its local batch is then ``micro_batch_size x
accumulation_steps``; divide each micro-batch's loss by ``accumulation_steps`` as usual).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from batchfit.errors import ConfigurationError
from batchfit.policy.noise.noise_scale import GradientReading
from batchfit.runtime.steps.gradient_noise import ReadingLog, reading_of, scale_of, trained_parameters


class DataParallelNoise(ReadingLog):
    """Reads one ``GradientReading`` per optimizer step from ``model``'s gradient all-reduce, through
    a DDP communication hook that averages each bucket as DDP's default does and, on the way, adds
    the bucket's squared norm before the all-reduce (this rank's gradient) and after it (the mean
    over the ranks) into two scalars on the device.

    Small is the mean over the ranks of each one's squared norm (``local_batch_size`` samples), big
    the squared norm of the all-reduced gradient (``local_batch_size x world_size``). What it adds
    to the step: two squared-norm reductions per bucket on the device, and at ``end_step`` one
    all-reduce of one number (the ranks' squared norms summed) and one read of two numbers; the
    gradients themselves travel once, as without it. DDP takes one communication hook per model,
    for the model's life: this one replaces DDP's built-in all-reduce with the same average done
    in Python (``default_hooks.allreduce_hook``), and a model that has a hook already cannot take it.
    With ``scaler`` the scale's square is divided out, and a step whose gradients are not finite
    gives no reading (every rank sees the same), counted in ``skipped``.
    """

    def __init__(
        self,
        model: DistributedDataParallel,
        local_batch_size: int,
        *,
        scaler: torch.amp.GradScaler | None = None,
    ) -> None:
        if not isinstance(model, DistributedDataParallel):
            raise ConfigurationError(
                f"DataParallelNoise reads a DistributedDataParallel's all-reduce, got "
                f"{type(model).__name__}; on one device, read accumulated micro-batches with "
                f"AccumulationNoise."
            )
        if local_batch_size < 1:
            raise ConfigurationError(f"local_batch_size must be a positive integer, got {local_batch_size}.")
        device = trained_parameters(model.parameters())[0].device
        self.group = model.process_group
        self.world_size = dist.get_world_size(self.group)
        if self.world_size < 2:
            raise ConfigurationError(
                "the process group has one rank, so the all-reduced gradient is that rank's own; run "
                "two ranks or more (torchrun --nproc-per-node N), or read accumulated micro-batches "
                "on one device with AccumulationNoise."
            )
        self.local_batch_size, self.scaler = local_batch_size, scaler
        super().__init__()
        # This step's squared norms, summed over the buckets: [this rank's, the all-reduced].
        self.norms_sq = torch.zeros(2, dtype=torch.float64, device=device)
        model.register_comm_hook(self, _average_and_read)

    def end_step(self) -> GradientReading | None:
        """Call on every rank after the backward that all-reduced, before anything changes the
        gradients (``unscale_``, clipping, the optimizer's step): the step's reading, the same on
        every rank and kept in ``readings``; None for a step whose gradients are not finite."""
        local = self.norms_sq[:1].clone()
        dist.all_reduce(local, group=self.group)  # the ranks' squared norms, summed
        local_sum, big = torch.cat([local, self.norms_sq[1:]]).tolist()
        self.norms_sq.zero_()
        small, global_batch_size = local_sum / self.world_size, self.local_batch_size * self.world_size
        return self.keep(
            reading_of(self.local_batch_size, global_batch_size, small, big, scale_of(self.scaler))
        )


def _average_and_read(state, bucket):  # type: ignore[no-untyped-def]  # DDP reads the annotations
    """The communication hook: the bucket's squared norm, then DDP's own average, then the
    average's squared norm (unannotated: DDP rejects string annotations)."""
    buffer = bucket.buffer()
    state.norms_sq[0] += torch.linalg.vector_norm(buffer, dtype=torch.float64).square()

    def read(future: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
        averaged = future.value()
        state.norms_sq[1] += torch.linalg.vector_norm(averaged, dtype=torch.float64).square()
        return averaged

    return default_hooks.allreduce_hook(state.group, bucket).then(read)

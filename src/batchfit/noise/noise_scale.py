"""``noise_scale``: the gradient noise scale ``B_simple`` of a workload's own training step, read over
real optimizer steps (McCandlish et al. 2018, the two-batch estimator of ``policy.noise.noise_scale``),
with the model, optimizer, GradScalers and RNG put back afterwards, as after every search."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any, cast

import torch
from torch.nn.parallel import DistributedDataParallel
from torch.utils._pytree import tree_leaves
from typing_extensions import Unpack

from batchfit.errors import ConfigurationError, DoesNotFitError, NonFiniteError
from batchfit.noise.noise_scale_result import NoiseScaleResult
from batchfit.options import Sampling, Where
from batchfit.policy.noise.noise_scale import GradientReading, estimate
from batchfit.progress import Event, OnProgress, tell
from batchfit.runtime.devices.host import host_memory
from batchfit.runtime.devices.host_failure import host_ran_out
from batchfit.runtime.devices.oom import first_line, is_out_of_memory
from batchfit.runtime.devices.tracker import resident_tensors
from batchfit.runtime.distributed.gradient_noise import DataParallelNoise
from batchfit.runtime.distributed.lockstep import Alone, Lockstep, ranks
from batchfit.runtime.steps.finite import WHAT_TO_CHECK
from batchfit.runtime.steps.gradient_noise import AccumulationNoise
from batchfit.runtime.steps.micro_batches import micro_batch, plain
from batchfit.runtime.steps.state import TrainingSnapshot
from batchfit.runtime.workloads.batches import check_batch_size, collated, on_host, to_device
from batchfit.runtime.workloads.default_step import check_steps_on_gradients, model_loss
from batchfit.runtime.workloads.entry import check_entry
from batchfit.runtime.workloads.workload import Workload, check_model_on
from batchfit.where import ResolvedDevice, WhereShorthand, where_of

__all__ = ["NoiseScaleResult", "noise_scale"]


def noise_scale(
    workload: Workload,
    *,
    sampling: Sampling,
    where: Where | None = None,
    on_progress: OnProgress | None = None,
    **shorthand: Unpack[WhereShorthand],
) -> NoiseScaleResult:
    """Measure the simple gradient noise scale of ``workload``'s training step over
    ``sampling.steps`` optimizer steps, then put model, optimizer, GradScalers and RNG back.

    Each step trains ``sampling.batch_size`` fresh samples (``make_batch(batch_size)``, or that many
    of the dataset's items drawn at random) as micro-batches of ``sampling.micro_batch_size``,
    their mean losses divided by the accumulation steps, then steps the optimizer (unless
    ``sampling.fixed_weights``). On one device a step's reading is its micro-batches' gradients
    against their accumulated one; under torch.distributed (2+ ranks) it is each rank's share
    against the all-reduced gradient, through the communication hook of a
    ``DistributedDataParallel`` made for the measurement, and every rank gets the same result.
    The step is the workload's default one (``loss_fn``, or the model's own loss): a ``train_step``
    does its own backward, where no micro-batch can be read, so it is refused. With
    ``memory_limit`` the steps run under a cap at ``memory_fraction`` of it. ``on_progress`` hears
    each step's reading and the estimate so far.
    ``where`` says where to measure (a ``batchfit.Where``); ``device``, ``memory_limit`` and
    ``memory_fraction`` are its shorthand for the one-line call (one that disagrees with
    ``where`` is a ConfigurationError).
    """
    check_entry("noise_scale", workload, on_progress, sampling=(sampling, Sampling))
    chosen = where_of("noise_scale", where, shorthand)
    target = ResolvedDevice.of(chosen)
    team = ranks()
    micro, accumulation = sampling.split(team.world_size)
    team.run(lambda: _check_workload(workload, target.device.torch_device, sampling.fixed_weights))
    started = time.perf_counter()
    optimizer = None if sampling.fixed_weights else _optimizer(workload)
    snapshot = TrainingSnapshot.capture(workload.module, optimizer, workload.functions)
    try:
        snapshot.set_gradients_aside()
        seed = team.shared(lambda: int(torch.randint(2**62, ())))  # the ranks draw the same batches
        run = _Run(workload, target, optimizer, team, micro, accumulation, seed)
        with _capped(run, chosen.memory_limit is not None):
            readings = run.read(sampling.steps, on_progress)
    finally:
        snapshot.restore(gradients=True)
        target.device.release()
    return NoiseScaleResult(
        estimate(readings),
        tuple(readings),
        sampling.batch_size,
        micro,
        accumulation,
        team.world_size,
        sampling.fixed_weights,
        str(target.device.torch_device),
        time.perf_counter() - started,
    )


class _Run:
    """One measurement: the model that runs the steps (a DDP of the module under 2+ ranks), the
    reader of its gradients, and the batches it draws."""

    def __init__(
        self,
        workload: Workload,
        target: ResolvedDevice,
        optimizer: torch.optim.Optimizer | None,
        team: Lockstep | Alone,
        micro: int,
        accumulation: int,
        seed: int,
    ) -> None:
        self.workload, self.target, self.optimizer, self.team = workload, target, optimizer, team
        self.micro, self.accumulation, self.seed = micro, accumulation, seed
        self.model: torch.nn.Module = workload.module
        self.reader: AccumulationNoise | DataParallelNoise
        if team.world_size > 1:
            self.model = _data_parallel(workload)
            self.reader = DataParallelNoise(self.model, micro * accumulation)  # type: ignore[arg-type]
        else:
            self.reader = AccumulationNoise(workload.module.parameters(), micro)

    def read(self, steps: int, on_progress: OnProgress | None) -> list[GradientReading]:
        """``steps`` optimizer steps, each read; the readings."""
        self.workload.module.train()
        readings: list[GradientReading] = []
        first: Any = None
        for step in range(1, steps + 1):
            batch = self._batch(step)
            if step <= 2 and _same_batch(first, batch):
                tell(on_progress, Event("noise-scale", "note", message=SAME_BATCH))
            first = batch if step == 1 else None
            readings.append(self.step(step, batch))
            so_far = estimate(readings)
            value = f"{so_far.b_simple:.4g} so far" if so_far.resolved else "not resolved yet"
            message = f"noise-scale step {step}/{steps}: B_simple {value}"
            tell(on_progress, Event("noise-scale", "reading", "train", self.micro, message=message))
        return readings

    def step(self, step: int, host_batch: Any) -> GradientReading:
        """One optimizer step on this rank's share of ``host_batch``, its micro-batches read."""
        local = self.micro * self.accumulation
        share = micro_batch(host_batch, self.team.rank * local, local, self.workload.batch_dim)
        self.workload.module.zero_grad(set_to_none=True)
        losses = torch.zeros((), dtype=torch.float64, device=self.target.device.torch_device)
        for index in range(self.accumulation):
            part = micro_batch(share, index * self.micro, self.micro, self.workload.batch_dim)
            batch = to_device(part, self.target.device.torch_device)
            syncing = isinstance(self.model, DistributedDataParallel) and index < self.accumulation - 1
            with self.model.no_sync() if syncing else contextlib.nullcontext():  # type: ignore[operator]
                loss = model_loss(self.model, batch, self.workload.loss_fn)
                losses += loss.detach()
                (loss / self.accumulation).backward()
            if isinstance(self.reader, AccumulationNoise):
                self.reader.after_backward()
        reading = self.reader.end_step()
        finite = all(self.team.run(lambda: bool(losses.isfinite())))
        if not finite or reading is None:
            what = "loss is" if not finite else "gradients are"
            raise NonFiniteError(
                f"the train step's {what} not finite (NaN or inf) at batch_size="
                f"{self.micro * self.accumulation * self.team.world_size}, step {step}; the noise scale "
                f"is read from steps that train. {WHAT_TO_CHECK}"
            )
        if self.optimizer is not None:
            self.optimizer.step()
        return reading

    def _batch(self, step: int) -> Any:
        """Step ``step``'s batch of every rank, on the host: the same on every rank (drawn from
        the shared seed), each taking its share."""
        workload, size = self.workload, self.micro * self.accumulation * self.team.world_size
        if workload.make_batch is not None:
            torch.manual_seed(self.seed + step)  # the user's RNG comes back with the snapshot
            batch, source = workload.make_batch(size), f"make_batch({size})"
        else:
            count = len(workload.dataset)
            if count < size:
                raise ConfigurationError(
                    f"Workload.dataset holds {count} items, fewer than batch_size ({size}); pass a "
                    f"smaller batch_size, or a larger dataset."
                )
            drawn = torch.randperm(count, generator=torch.Generator().manual_seed(self.seed + step))
            batch = collated(workload.dataset, drawn[:size].tolist(), size, workload.collate_fn)
            source = f"the collated batch of {size} dataset items"
        batch = plain(batch)
        check_batch_size(batch, size, workload.batch_dim, source)
        return on_host(batch)


#: What a workload whose batches do not change is told.
SAME_BATCH = (
    "the first two steps drew the same batch: the noise scale is then that batch's own, not the "
    "data's; make make_batch(n) return new samples on each call (as a data loader does), or pass a "
    "dataset."
)


def _same_batch(first: Any, second: Any) -> bool:
    """Whether two host batches hold the same tensors (a ``make_batch`` that ignores the RNG)."""
    if first is None:
        return False
    one, two = tree_leaves(first), tree_leaves(second)
    tensors = all(isinstance(leaf, torch.Tensor) for leaf in [*one, *two])
    return (
        tensors
        and len(one) == len(two)
        and all(a.shape == b.shape and torch.equal(a, b) for a, b in zip(one, two, strict=True))
    )


def _check_workload(workload: Workload, device: torch.device, fixed_weights: bool) -> None:
    """A ConfigurationError where the workload's step cannot be read: a ``train_step`` of its own,
    no optimizer to train with, or one that needs a closure; or a model that is not on ``device``."""
    if workload.train_step is not None:
        raise ConfigurationError(
            "Workload.train_step does its own backward and optimizer step, so batchfit cannot read "
            "its micro-batches' gradients; give the Workload a loss_fn (or a model that returns its "
            "loss) for noise_scale, or read the noise scale inside your own loop with "
            "batchfit.runtime.steps.gradient_noise.AccumulationNoise (docs/goodput.md)."
        )
    if not fixed_weights and workload.optimizer is None:
        raise ConfigurationError(
            "noise_scale trains the steps it reads, which needs Workload.optimizer; pass one, or "
            "Sampling(fixed_weights=True) to read every step at the weights as they are."
        )
    check_model_on(workload.module, device)


def _optimizer(workload: Workload) -> torch.optim.Optimizer:
    """The optimizer the steps train with: the workload's, or one its factory makes."""
    optimizer = workload.optimizer
    if not isinstance(optimizer, torch.optim.Optimizer):  # a factory: _check_workload saw one
        optimizer = cast(Callable[..., torch.optim.Optimizer], optimizer)(workload.module.parameters())
    check_steps_on_gradients(optimizer, "noise_scale")
    return optimizer


def _data_parallel(workload: Workload) -> DistributedDataParallel:
    """A ``DistributedDataParallel`` of the workload's module for the measurement alone (DDP takes
    one communication hook per model, for its life), as the workload's own DDP is set up."""
    own = workload.model if isinstance(workload.model, DistributedDataParallel) else None
    return DistributedDataParallel(
        workload.module,
        find_unused_parameters=bool(own and own.find_unused_parameters),
        broadcast_buffers=own.broadcast_buffers if own is not None else True,
    )


@contextlib.contextmanager
def _capped(run: _Run, capped: bool) -> Iterator[None]:
    """The steps under a cap at the target's share of ``memory_limit`` (none without one); an
    out-of-memory there is a ``DoesNotFitError`` that says what to lower."""
    if not capped:
        yield
        return
    device, workload = run.target.device, run.workload
    resident = list(resident_tensors(workload.module, run.optimizer, *workload.reached))
    budget = int(run.target.memory_fraction * device.capacity_bytes(resident, workload.wrapper_bytes))
    host, measured = host_memory(), []
    try:
        with device.measure(resident, budget, wrapper_bytes=workload.wrapper_bytes) as measurement:
            measured.append(measurement)  # its refusal is read when the block has closed
            yield
    except BaseException as error:
        refused = measured and measured[0].refused  # the cap refused first: the budget's
        where = "a micro-batch of the noise scale's step"
        ran_out = None if refused else host_ran_out(error, device, budget, host, run.micro, where)
        if ran_out is not None:  # the machine's memory, not the budget's: a smaller micro-batch is no cure
            raise ran_out from error
        if not is_out_of_memory(error):
            raise
        raise DoesNotFitError(
            f"out of memory reading the noise scale at micro_batch_size={run.micro} ({first_line(error)}); "
            f"pass a smaller micro_batch_size (more accumulation_steps): the noise scale does not depend "
            f"on it.",
            budget_bytes=budget,
        ) from error

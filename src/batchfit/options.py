"""The options several verbs share, each a small typed object validated when it is made: where to
measure (``Where``), which batch sizes (``BatchSizes``), how a memory trial runs (``Trials``), how
throughput is timed (``Timing``), what explore aims at (``Goal``) and how the noise scale is
sampled (``Sampling``). The command line's flags are generated from their fields, so a flag is its
field's name with dashes and says what its field says. They are pure data: this module imports no
algorithm and no torch (``batchfit.where`` resolves a ``Where`` into a device)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from batchfit.checks import (
    DEFAULT_MAX_BATCH_SIZE,
    SAMPLE_TOLERANCE,
    Candidates,
    Mode,
    Objective,
    check_batch_range,
    check_choice_rules,
    check_device,
    check_divisible,
    check_flag,
    check_memory_fraction,
    check_multiple_in_range,
    check_noise_scale,
    check_number,
    check_positive_int,
    check_positive_number,
    default_max_batch_size,
    option,
)
from batchfit.errors import ConfigurationError
from batchfit.units import parse_bytes

if TYPE_CHECKING:
    import torch

    from batchfit.policy.noise.noise_scale import NoiseScale


def mode_named(mode: str) -> Mode:
    """``train`` or ``eval`` (``val``, the experiment configs' word, is ``eval``); else an error."""
    if mode == "val":
        return "eval"
    if mode not in ("train", "eval"):
        raise ConfigurationError(f"mode={mode!r} is not a mode: use 'train' or 'eval' (or 'val').")
    return mode  # type: ignore[return-value]


@dataclass(frozen=True)
class Where:
    """Where to measure: the device, the capacity it is given, and the share of it a batch may use."""

    device: str | torch.device | None = option(
        None, "cpu, cuda or cuda:N (default: cuda if available, else cpu)"
    )
    memory_limit: str | int | None = option(
        None,
        "a capacity such as 2GiB: the device's memory is capped there (a smaller GPU, or a CPU as "
        "one); KiB, MiB, GiB, TiB (or Ki, Mi, Gi, Ti) are binary (1024^N bytes), kB, MB, GB, TB "
        "decimal (1000^N), a bare number is bytes; a prefix alone (64M) is refused: write 64MB or 64MiB",
    )
    memory_fraction: float = option(0.8, "share of device memory a batch may use")
    memory_limit_bytes: int | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.device is not None:
            check_device(self.device)
        check_memory_fraction(self.memory_fraction)
        limit = None if self.memory_limit is None else parse_bytes(self.memory_limit, name="memory_limit")
        object.__setattr__(self, "memory_limit_bytes", limit)


@dataclass(frozen=True)
class BatchSizes:
    """Which batch sizes a search may answer: the multiples of ``multiple_of`` in [min_batch_size,
    max_batch_size] and, with ``global_batch_size``, the divisors of the batch each device trains."""

    min_batch_size: int = option(1, "the smallest batch to try")
    max_batch_size: int | None = option(
        None, f"the largest batch to try (default: {DEFAULT_MAX_BATCH_SIZE} for train; eval's is twice it)"
    )
    multiple_of: int | None = option(None, "only batch sizes that are multiples of N")
    global_batch_size: int | None = option(
        None, "the global batch the run trains with: a micro-batch must divide it / --world-size"
    )
    world_size: int | None = option(
        None, "devices the global batch is split over (default: the ranks under torchrun, else 1)"
    )
    must_fit_from: int | None = option(
        None,
        "every batch from N up to the answer must fit: the smallest batch the run sees (a last "
        "batch, an eval batch, a restart); default: 1 for a workload with a dataset (its last batch "
        "can be any size), else min_batch_size; a size at or above the answer checks it alone",
    )

    def __post_init__(self) -> None:
        check_positive_int("min_batch_size", self.min_batch_size)
        for name in ("max_batch_size", "multiple_of", "global_batch_size", "world_size", "must_fit_from"):
            value = getattr(self, name)
            if value is not None:
                check_positive_int(name, value)
        check_batch_range(self.min_batch_size, self.upper("train"))
        check_multiple_in_range(self.min_batch_size, self.upper("train"), self.multiple_of)
        check_divisible(self.global_batch_size, self.world_size or 1)

    def upper(self, mode: Mode) -> int:
        """The largest batch a ``mode`` search may answer: ``max_batch_size``, else the default
        (eval's is twice train's: an eval step keeps no activations for backward)."""
        return default_max_batch_size(mode) if self.max_batch_size is None else self.max_batch_size

    def for_mode(self, mode: Mode) -> BatchSizes:
        """These sizes, given for training, as an eval search takes them when one range serves
        both modes (the command line's): eval's upper bound is twice train's."""
        return replace(self, max_batch_size=default_max_batch_size(mode, self.upper("train")))

    def candidates(self, mode: Mode) -> Candidates:
        """The sizes a ``mode`` search walks: an arithmetic range (``find`` takes no global batch)."""
        if self.global_batch_size is not None:
            raise ConfigurationError(
                f"global_batch_size={self.global_batch_size} narrows the sizes explore and compare "
                f"measure; find searches the whole range. Leave it out, or run explore or plan."
            )
        return Candidates.between(self.min_batch_size, self.upper(mode), self.multiple_of)


@dataclass(frozen=True)
class Trials:
    """How a memory trial runs: its steps, and the steps the answer trains before it is final."""

    steps_per_trial: int = option(2, "steps per trial")
    confirm_steps: int | None = option(
        None,
        "steps the answer trains before it is final, and every trial after the first that fails "
        "(default: 10 on CUDA, 40 with expandable segments, none on the CPU)",
    )
    eval_with_training_state: bool = option(
        True,
        "an eval search keeps gradients and optimizer state resident, as validation inside training does",
        cli=False,
    )
    warm_batch_size: int | None = option(
        None,
        "the training batch an eval search warms up with, making that state resident (default: the "
        "smallest candidate)",
        cli=False,
    )

    def __post_init__(self) -> None:
        check_positive_int("steps_per_trial", self.steps_per_trial)
        check_flag("eval_with_training_state", self.eval_with_training_state)
        if self.warm_batch_size is not None:
            check_positive_int("warm_batch_size", self.warm_batch_size)
        if self.confirm_steps is not None:
            check_positive_int("confirm_steps", self.confirm_steps)


@dataclass(frozen=True)
class Timing:
    """How throughput is timed: windows per batch size, steps per window, and the time allowed."""

    windows: int = option(3, "timing windows per batch size")
    steps_per_window: int | None = option(None, "steps per window (default: the fewest that last 20 ms)")
    time_budget_seconds: float | None = option(None, "start nothing new after this many seconds")
    time_slow: bool = option(
        False, "compare, advise: search and time a technique whose step is 3x the baseline's or more"
    )
    tokens_per_sample: int | None = option(
        None, "count throughput in tokens of this many per sample (default: the workload's)", cli=False
    )

    def __post_init__(self) -> None:
        check_positive_int("windows", self.windows)
        for name in ("steps_per_window", "tokens_per_sample"):
            value = getattr(self, name)
            if value is not None:
                check_positive_int(name, value)
        if self.time_budget_seconds is not None:
            check_positive_number("time_budget_seconds", self.time_budget_seconds, allow_zero=True)


@dataclass(frozen=True)
class Goal:
    """What explore recommends: the smallest batch within ``tolerance`` of the fastest (or the
    fastest), once it is ``confidence_target`` sure; with ``noise_scale``, also the batches that
    train fastest to a target and spend the fewest samples (goodput, docs/goodput.md)."""

    tolerance: float = option(0.03, "within this share of the best counts as as fast")
    objective: Objective = option("smallest-within-tolerance", "what to recommend")
    base_batch_size: int | None = option(None, "the speed-up's base (default: the smallest measured)")
    confidence_target: int = option(
        90, "the confidence asked of the recommendation; stop once it is reached (0-100)"
    )
    noise_scale: float | NoiseScale | None = option(
        None,
        "the gradient noise scale B_noise in samples (a number, or a measured NoiseScale): also "
        "predict the batch that trains fastest to a target (goodput)",
    )
    sample_tolerance: float = option(
        SAMPLE_TOLERANCE, "goodput's sample-optimal batch spends samples within this share of the fewest"
    )

    def __post_init__(self) -> None:
        if self.base_batch_size is not None:
            check_positive_int("base_batch_size", self.base_batch_size)
        if self.noise_scale is not None:
            check_noise_scale(self.noise_scale)
        check_positive_number("sample_tolerance", self.sample_tolerance, allow_zero=True)
        check_number("tolerance", self.tolerance)
        check_number("confidence_target", self.confidence_target)
        check_choice_rules(self.tolerance, self.objective, self.confidence_target)


@dataclass(frozen=True)
class Sampling:
    """How the noise scale is measured: the big batch (one optimizer step's), the small one (a
    micro-batch on one device; one rank's share under torchrun), and over how many steps."""

    batch_size: int = option(
        dataclasses.MISSING, "the big batch: the samples of one optimizer step, over every rank"
    )
    micro_batch_size: int | None = option(
        None, "the small batch on one device: samples per forward (default: batch_size / accumulation_steps)"
    )
    accumulation_steps: int | None = option(
        None, "micro-batches per optimizer step (default: batch_size / micro_batch_size)"
    )
    steps: int = option(20, "optimizer steps to read the gradients of")
    fixed_weights: bool = option(
        False, "read every step's gradients at the model's weights as they are, without optimizer steps"
    )

    def __post_init__(self) -> None:
        for name in ("batch_size", "micro_batch_size", "accumulation_steps", "steps"):
            value = getattr(self, name)
            if value is not None:
                check_positive_int(name, value)
        check_flag("fixed_weights", self.fixed_weights)

    def split(self, world_size: int) -> tuple[int, int]:
        """``(micro_batch_size, accumulation_steps)`` on each of ``world_size`` ranks; a
        ConfigurationError where the sizes do not divide, disagree, or leave no small batch."""
        local, remainder = divmod(self.batch_size, world_size)
        if remainder:
            raise ConfigurationError(
                f"batch_size ({self.batch_size}) must be divisible by world_size ({world_size}): each "
                f"rank trains an equal share; pass a multiple of {world_size}."
            )
        micro, accumulation = self.micro_batch_size, self.accumulation_steps
        if micro is None and accumulation is None:
            if world_size == 1:
                raise ConfigurationError(
                    f"on one device the noise scale compares micro-batches with the batch of "
                    f"{self.batch_size} they add up to: pass micro_batch_size (a divisor of "
                    f"{self.batch_size} below it, such as {_half(self.batch_size)}) or accumulation_steps."
                )
            accumulation = 1
        micro = micro if micro is not None else local // (accumulation or 1)
        accumulation = accumulation if accumulation is not None else local // micro
        if micro * accumulation != local:
            raise ConfigurationError(
                f"micro_batch_size x accumulation_steps ({micro} x {accumulation}) must equal the batch "
                f"each of {world_size} device(s) trains ({local} of batch_size {self.batch_size}); "
                f"pass one of them and batchfit derives the other."
            )
        if world_size == 1 and accumulation == 1:
            raise ConfigurationError(
                f"micro_batch_size ({micro}) equals batch_size ({self.batch_size}), so the small batch "
                f"is the big one and the two give no noise scale; pass a micro_batch_size below it "
                f"that divides it, such as {_half(self.batch_size)}."
            )
        return micro, accumulation


def _half(size: int) -> int:
    """The largest divisor of ``size`` at most half of it (1 for a prime)."""
    return next(divisor for divisor in range(size // 2, 0, -1) if size % divisor == 0)

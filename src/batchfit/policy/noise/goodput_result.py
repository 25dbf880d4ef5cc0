"""What goodput predicts, free of torch: each measured batch to a target (time, samples, steps,
statistical efficiency, goodput), the batches chosen, and each against the largest measured batch
and the fastest, as a table and as JSON. The arithmetic is ``batchfit.policy.noise.goodput``'s."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from batchfit.policy.explore.ratios import ratio_text


@dataclass(frozen=True)
class BatchGoodput:
    """One measured batch size, predicted to a target; the ratios are over the time-optimal batch's."""

    batch_size: int
    samples_per_second: float
    efficiency: float  # E_min / E(B) = B_noise / (B + B_noise): 1 in the small-batch limit
    goodput: float  # samples_per_second x efficiency
    time_ratio: float
    samples_ratio: float
    steps_ratio: float


@dataclass(frozen=True)
class Versus:
    """A chosen batch against a reference batch: its predicted time, samples and steps to the target
    over the reference's; the time's 90% interval from the two throughputs' errors (None without)."""

    chosen: str  # "time-optimal" or "sample-optimal"
    batch_size: int
    reference: str  # "largest" (the largest measured: explore's memory-safe bound) or "fastest"
    reference_batch_size: int
    time_ratio: float
    samples_ratio: float
    steps_ratio: float
    time_ratio_low: float | None = None
    time_ratio_high: float | None = None

    def line(self, name: str | None = None) -> str:
        """``0.52x [0.49, 0.55] the time, ...`` of the reference, called ``name`` (default: its own)."""
        time = ratio_text(self.time_ratio, self.time_ratio_low, self.time_ratio_high)
        return (
            f"{time} the time, {self.samples_ratio:.2f}x the samples and {self.steps_ratio:.2f}x the "
            f"steps of {name or _NAMES[self.reference]} ({self.reference_batch_size})"
        )


_NAMES = {"largest": "the largest measured", "fastest": "the fastest"}


@dataclass(frozen=True)
class Goodput:
    """Every measured batch predicted to a target at the noise scale, and the batches to choose.

    ``time_optimal`` is the batch of the shortest predicted time (the highest goodput);
    ``time_optimal_range`` every batch that is time-optimal for some noise scale in its 90%
    interval (None without an interval); ``sample_optimal`` the fastest to the target of the
    batches whose samples stay within ``sample_tolerance`` of the fewest (None where none does).
    """

    noise_scale: float  # B_noise in samples; inf where the noise hid the signal (unresolved)
    noise_scale_low: float | None
    noise_scale_high: float | None
    measured: bool  # a measured NoiseScale, or a number given
    world_size: int  # a step's batch is batch_size x world_size
    sample_tolerance: float
    unit: str
    rows: tuple[BatchGoodput, ...]
    time_optimal: int
    time_optimal_range: tuple[int, ...] | None
    sample_optimal: int | None
    fastest: int
    largest: int
    versus: tuple[Versus, ...]

    @property
    def resolved(self) -> bool:
        return math.isfinite(self.noise_scale)

    @property
    def settled(self) -> bool:
        """Whether the noise scale's interval leaves the time-optimal batch where it is."""
        return self.time_optimal_range is not None and len(self.time_optimal_range) == 1

    def row(self, batch_size: int) -> BatchGoodput:
        return next(row for row in self.rows if row.batch_size == batch_size)

    def lines(self) -> list[str]:
        """The choices, each against the largest measured batch and the fastest, and what to trust."""
        lines = self._choice("time-optimal", self.time_optimal, "the highest goodput")
        tolerance = f"samples within {self.sample_tolerance:.0%} of the fewest"
        if self.sample_optimal is not None:
            lines += self._choice("sample-optimal", self.sample_optimal, tolerance)
        else:
            smallest = min(row.batch_size for row in self.rows) * self.world_size
            limit = self.sample_tolerance * self.noise_scale
            fix = (
                f"a step's batch of at most {limit:.0f} would: lower min_batch_size"
                if limit >= 1
                else "no batch can, at this noise scale"
            )
            lines.append(
                f"sample-optimal: no measured batch keeps its {tolerance} (the smallest, a step's batch "
                f"of {smallest}, "
                f"uses {1 + smallest / self.noise_scale:.2f}x them); {fix}"
            )
        return [*lines, self.sureness()]

    def _choice(self, chosen: str, batch_size: int, why: str) -> list[str]:
        """A chosen batch's head line, then its ratios to each reference that is another batch
        (one line for both where the largest measured is the fastest)."""
        against = [versus for versus in self.versus if versus.chosen == chosen]
        same = [_NAMES[versus.reference] for versus in against if versus.reference_batch_size == batch_size]
        also = f"; it is also {' and '.join(same)}" if same else ""
        others = [versus for versus in against if versus.reference_batch_size != batch_size]
        if len(others) == 2 and others[0].reference_batch_size == others[1].reference_batch_size:
            return [
                f"{chosen} batch_size {batch_size} ({why}):",
                f"  {others[0].line(' and '.join(_NAMES.values()))}",
            ]
        return [
            f"{chosen} batch_size {batch_size} ({why}{also}):",
            *(f"  {versus.line()}" for versus in others),
        ]

    def sureness(self) -> str:
        """What the noise scale's interval says of the time-optimal batch, in one line."""
        if not self.resolved:
            return (
                "the noise scale is unresolved (the noise hid the signal): larger batches are taken to "
                "cost no extra samples, so the time-optimal batch is the fastest; measure the noise "
                "scale at larger batches to know how far that holds"
            )
        if self.time_optimal_range is None:
            return (
                f"the noise scale {self.noise_scale:g} has no interval: the choice is as sure as that "
                "number (a measured noise scale of 3 or more steps gives one)"
            )
        interval = f"[{self.noise_scale_low:.0f}, {self.noise_scale_high:.0f}]"
        if self.settled:
            return f"settled: time-optimal across the noise scale's 90% interval {interval}"
        sizes = ", ".join(str(size) for size in self.time_optimal_range)
        return (
            f"not settled by the noise scale: across its 90% interval {interval} the time-optimal "
            f"batch is any of {sizes}; measure the noise scale over more steps to narrow it"
        )

    def table(self) -> str:
        scale = "unresolved" if not self.resolved else f"{self.noise_scale:g}"
        if self.noise_scale_low is not None and self.noise_scale_high is not None:
            scale += f" [{self.noise_scale_low:.0f}, {self.noise_scale_high:.0f}]"
        source = "measured" if self.measured else "given"
        head = f"goodput at noise scale {scale} ({source}); time, samples and steps to a target:"
        columns = f"{'batch_size':>10}  {self.unit:>12}  {'efficiency':>10}  {'goodput':>12}"
        lines = [head, f"{columns}  {'time':>6}  {'samples':>7}  {'steps':>6}"]
        marks = (
            (self.time_optimal, "time-optimal"),
            (self.sample_optimal, "sample-optimal"),
            (self.fastest, "fastest"),
            (self.largest, "largest"),
        )
        for row in self.rows:
            named = [name for size, name in marks if size == row.batch_size]
            mark = f"  <- {', '.join(named)}" if named else ""
            lines.append(
                f"{row.batch_size:>10}  {row.samples_per_second:>12.1f}  {row.efficiency:>10.3f}  "
                f"{row.goodput:>12.1f}  {row.time_ratio:>5.2f}x  {row.samples_ratio:>6.2f}x  "
                f"{row.steps_ratio:>5.2f}x{mark}"
            )
        return "\n".join([*lines, *self.lines()]) + "\n"

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["noise_scale"] = self.noise_scale if self.resolved else None
        data["resolved"], data["settled"] = self.resolved, self.settled
        data["time_optimal_range"] = (
            None if self.time_optimal_range is None else list(self.time_optimal_range)
        )
        data["lines"] = self.lines()
        return data

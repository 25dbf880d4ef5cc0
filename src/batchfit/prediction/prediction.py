"""What ``predict`` is asked (``Targets``: the capacities and cards, and what to keep back) and
what it answers (``Prediction``: a row per target, with the recorded trials and their requests)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

from batchfit.checks import option
from batchfit.errors import ConfigurationError
from batchfit.policy.allocator.allocation_record import AllocationRecord
from batchfit.policy.capacity.capacity_prediction import CapacityPrediction, Memory, Unmodelled
from batchfit.policy.capacity.cards import CARDS, card_named
from batchfit.policy.search.trial import Mode, Trial
from batchfit.result import stamped
from batchfit.units import format_bytes, parse_bytes

#: How a mode's requests were recorded (``Prediction.recorded_by``): a fake-tensor trace of the
#: trials (from the CPU alone, nothing allocated), or the trials run.
TRACE, TRIALS = "trace", "trials"


def _listed(value: Any) -> tuple[str, ...]:
    """A comma-separated string, or a sequence, as a tuple of its non-empty items."""
    if value is None:
        return ()
    items = value.split(",") if isinstance(value, str) else [str(item) for item in value]
    return tuple(item.strip() for item in items if item.strip())


@dataclass(frozen=True)
class Targets:
    """The GPUs to predict for: totals in bytes, cards by name, and what to keep back on each."""

    capacities: str | tuple[str, ...] | None = option(
        None, "comma-separated GPU memory totals to predict for, e.g. 24GiB,40GiB,80GiB"
    )
    gpus: str | tuple[str, ...] | None = option(
        None, f"comma-separated cards to predict for: {', '.join(CARDS)}"
    )
    reserve: str | int = option(0, "memory to keep back on each target besides the CUDA context, e.g. 1GiB")
    context: bool = option(
        True,
        "take an estimated CUDA context off each capacity (--no-context: a capacity is what the "
        "allocator may use, as on the CPU stand-in)",
    )
    reserve_bytes: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "capacities", _listed(self.capacities))
        object.__setattr__(self, "gpus", _listed(self.gpus))
        for capacity in self.capacities or ():
            parse_bytes(capacity, name="capacities")
        for gpu in self.gpus or ():
            card_named(gpu)
        if not self.capacities and not self.gpus:
            raise ConfigurationError(
                "predict needs a target: capacities=['24GiB'] (--capacities 24GiB) or "
                f"gpus=['A100-40GB'] (--gpus A100-40GB; known: {', '.join(CARDS)})."
            )
        reserve = 0 if self.reserve in (0, "0") else parse_bytes(self.reserve, name="reserve")
        object.__setattr__(self, "reserve_bytes", reserve)

    def memories(self) -> list[tuple[Memory, bool]]:
        """Each target's memory and whether it is Hopper or later (cuBLAS's workspace is larger);
        a capacity's architecture is not known and is taken as Hopper, the larger workspace.
        Without ``context``, a capacity holds nothing beside the allocator."""
        found = [
            (Memory.of_capacity(str(capacity), parse_bytes(capacity, name="capacities"), self.context), True)
            for capacity in self.capacities or ()
        ]
        for gpu in self.gpus or ():
            card = card_named(gpu)
            found.append((Memory.of_card(card), card.hopper))
        return found

    def keywords(self) -> dict[str, Any]:
        return {
            "capacities": self.capacities,
            "gpus": self.gpus,
            "reserve": self.reserve,
            "context": self.context,
        }


@dataclass(frozen=True)
class PredictionRow:
    """One target: its memory, the budget the allocator gets there, and each mode's prediction."""

    target: str
    total_bytes: int
    context_bytes: int
    budget_bytes: int
    train: CapacityPrediction | None
    eval: CapacityPrediction | None

    @classmethod
    def of(
        cls, memory: Memory, modes: dict[Mode, CapacityPrediction], fraction: float, reserve: int
    ) -> PredictionRow:
        budget = memory.budgets(fraction, reserve)[0]
        train, evaluation = modes.get("train"), modes.get("eval")
        return cls(memory.name, memory.total_bytes, memory.context_bytes, budget, train, evaluation)


@dataclass(frozen=True)
class Prediction:
    """The largest batch predicted on each target, and its evidence: the trials recorded (on
    ``device``), their allocator requests (``records``, which a replay or a later search can play
    again), what the prediction models and what it does not (each widening the band)."""

    device: str
    cpu_alone: bool
    memory_fraction: float
    reserve_bytes: int
    steps: int  # the steps each replay plays, as find's confirming trials run them
    rows: tuple[PredictionRow, ...]
    recorded_trials: dict[Mode, tuple[Trial, ...]]
    records: dict[Mode, dict[int, AllocationRecord]]
    unmodelled: tuple[Unmodelled, ...]
    modelled: tuple[str, ...]
    seconds: float
    # What the recording device held for the trials (None from the CPU alone: not a GPU's), the
    # capacity at which ``recorded_trials`` are measured points.
    recorded_capacity_bytes: int | None = None
    # How each mode's requests were recorded: TRACE ("trace": from the CPU alone, the trials run on
    # fake tensors, nothing allocated) or TRIALS ("trials": run on the device).
    recorded_by: dict[Mode, str] = field(default_factory=dict)
    # Why a mode from the CPU alone was not traced, its real trials recorded instead ("" for none).
    untraced: dict[Mode, str] = field(default_factory=dict)

    command: ClassVar[str] = "predict"

    def to_dict(self) -> dict[str, Any]:
        document = asdict(self)
        document["records"] = {
            mode: {str(size): record.to_dict() for size, record in records.items()}
            for mode, records in self.records.items()
        }
        return stamped(self.command, document)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"

    def table(self) -> str:
        """A line per target: the largest train and eval batch, the predicted peaks, the band."""
        header = ["target", "budget", "train", "band", "eval", "band", "peak allocated", "peak reserved"]
        lines = [header]
        for row in self.rows:
            cells = [row.target, format_bytes(row.budget_bytes)]
            for prediction in (row.train, row.eval):
                cells += [_answer(prediction), _band(prediction)]
            first = row.train or row.eval
            peaks = (first.peak_allocated_bytes, first.peak_reserved_bytes) if first else (None, None)
            cells += [format_bytes(peak) if peak else "-" for peak in peaks]
            lines.append(cells)
        widths = [max(len(line[index]) for line in lines) for index in range(len(header))]
        text = ["  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
                for line in lines]  # fmt: skip
        how = {TRACE: "a fake-tensor trace", TRIALS: "real trials"}
        text.append("recorded by: " + ", ".join(f"{mode} {how[by]}" for mode, by in self.recorded_by.items()))
        return "\n".join(text) + "\n"

    def summary(self) -> str:
        """Where the records came from, what the band holds, and what is not modelled."""
        where = (
            f"the CPU alone, with CUDA's caching allocator modelled ({self.device})"
            if self.cpu_alone
            else self.device
        )
        sizes = sorted({size for records in self.records.values() for size in records})
        said = [
            f"Recorded on {where} at batch sizes {', '.join(map(str, sizes))}{self._how()}; replayed for "
            f"{self.steps} steps at {self.memory_fraction:g} of each target's memory less its CUDA context"
            + (f" and {format_bytes(self.reserve_bytes)} kept back." if self.reserve_bytes else ".")
        ]
        if self.unmodelled:
            parts = "; ".join(
                f"{each.part}, {each.share:.0%} of the budget (a guess)" for each in self.unmodelled
            )
            said.append(f"Not modelled, each widening the band: {parts}.")
        said.append("The band holds the context's and the card's ranges and the replay of the smaller pair.")
        return " ".join(said)

    def _how(self) -> str:
        """How the modes were recorded from the CPU alone, in brackets ("" on a GPU)."""
        if not self.cpu_alone:
            return ""
        traced = [mode for mode, by in self.recorded_by.items() if by == TRACE]
        parts = [f"{' and '.join(traced)} by a fake-tensor trace of the trials, nothing allocated"]
        parts = parts if traced else []
        parts += [
            f"{mode} by real trials, as no trace could be ({why})" for mode, why in self.untraced.items()
        ]
        return f" ({'; '.join(parts)})"


def _answer(prediction: CapacityPrediction | None) -> str:
    if prediction is None:
        return "-"
    if prediction.batch_size is None:
        return "none"
    return f"{prediction.batch_size}+" if prediction.at_max_batch_size else str(prediction.batch_size)


def _band(prediction: CapacityPrediction | None) -> str:
    if prediction is None:
        return "-"
    low, high = prediction.band
    return f"{'none' if low is None else low}-{'none' if high is None else high}"

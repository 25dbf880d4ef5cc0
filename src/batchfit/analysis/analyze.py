"""The search outside training, across memory fractions and modes, sharing its measurements.

A trial's peak does not depend on the memory fraction, only its verdict; so every fraction after the
first reuses the trials (and fake-tensor traces) of the others and runs only what is new.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, ClassVar

from typing_extensions import Unpack

from batchfit.checks import check_memory_fraction, check_option, type_name
from batchfit.errors import ConfigurationError
from batchfit.options import BatchSizes, Trials, Where, mode_named
from batchfit.policy.search.trial import Mode
from batchfit.policy.search.trial_cache import TrialCache
from batchfit.progress import OnProgress
from batchfit.result import stamped
from batchfit.runtime.workloads.entry import check_entry
from batchfit.runtime.workloads.workload import Workload
from batchfit.search.find_batch_size import find_on
from batchfit.search.search_result import SearchResult
from batchfit.search.starting_evidence import Known
from batchfit.units import format_bytes
from batchfit.where import CapacityShorthand, target_of


@dataclass(frozen=True)
class AnalysisRow:
    memory_fraction: float
    mode: Mode
    batch_size: int
    peak_bytes: int
    budget_bytes: int  # the budget: memory_fraction x capacity
    trials: int  # trials this search used (run now or reused)
    new_trials: int  # of which run for this row
    seconds: float


@dataclass(frozen=True)
class Analysis:
    rows: tuple[AnalysisRow, ...]
    trials_run: int  # real trials run in all
    separate_trials: int  # what separate searches would have run: the rows' trials added up
    traces_run: int  # fake-tensor traces run in all
    separate_traces: int  # what separate searches would have traced
    results: tuple[SearchResult, ...]

    command: ClassVar[str] = "analyze"

    def to_dict(self) -> dict[str, Any]:
        data = {
            "rows": [asdict(row) for row in self.rows],
            "trials_run": self.trials_run,
            "separate_trials": self.separate_trials,
            "traces_run": self.traces_run,
            "separate_traces": self.separate_traces,
            "device": self.results[0].device if self.results else None,  # with its cap, if any
        }
        return stamped(self.command, data)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"

    def to_jsonl(self) -> str:
        """One row a line."""
        return "".join(json.dumps(asdict(row)) + "\n" for row in self.rows)

    def to_csv(self) -> str:
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=list(AnalysisRow.__dataclass_fields__))
        writer.writeheader()
        writer.writerows(asdict(row) for row in self.rows)
        return buffer.getvalue()

    def summary(self) -> str:
        """The searches run, and the trials and traces they shared."""
        return (
            f"{self.trials_run} real trials for {len(self.rows)} searches ({self.separate_trials} if run "
            f"separately), {self.traces_run} fake-tensor traces ({self.separate_traces} if run separately)."
        )

    def table(self) -> str:
        header = ("fraction", "mode", "batch_size", "peak", "budget", "trials", "seconds")
        lines = ["{:>8}  {:<5}  {:>10}  {:>11}  {:>11}  {:>6}  {:>7}".format(*header)]
        for row in self.rows:
            lines.append(
                f"{row.memory_fraction:>8g}  {row.mode:<5}  {row.batch_size:>10}  "
                f"{format_bytes(row.peak_bytes):>11}  {format_bytes(row.budget_bytes):>11}  "
                f"{row.trials:>6}  {row.seconds:>7.2f}"
            )
        return "\n".join(lines) + "\n"


def analyze(
    workload: Workload,
    memory_fractions: Sequence[float],
    modes: Sequence[str] = ("train", "eval"),
    *,
    where: Where | None = None,
    sizes_by_mode: Mapping[Mode, BatchSizes] | None = None,
    trials_by_mode: Mapping[Mode, Trials] | None = None,
    on_progress: OnProgress | None = None,
    **shorthand: Unpack[CapacityShorthand],
) -> Analysis:
    """One search per (memory_fraction, mode), each mode's in ``sizes_by_mode[mode]`` with
    ``trials_by_mode[mode]`` (the defaults where a mode is missing); each mode's searches share one
    cache of measurements. ``on_progress`` hears every trial, labelled ``mode@fraction``. ``where``
    says where to measure (a ``batchfit.Where``; ``memory_fractions`` replace its
    ``memory_fraction``), ``device`` and ``memory_limit`` its shorthand."""
    check_entry("analyze", workload, on_progress)
    _check_arguments(memory_fractions, sizes_by_mode, trials_by_mode)
    named = [mode_named(mode) for mode in dict.fromkeys(modes)]
    base = target_of("analyze", where, shorthand, CapacityShorthand.__optional_keys__)
    rows, results = [], []
    caches = {mode: TrialCache() for mode in named}
    for mode in named:
        cache = caches[mode]
        for memory_fraction in memory_fractions:
            runs_before = cache.runs
            result = find_on(
                replace(base, memory_fraction=memory_fraction),
                workload,
                mode,
                (sizes_by_mode or {}).get(mode) or BatchSizes(),
                (trials_by_mode or {}).get(mode) or Trials(),
                _told(on_progress, f"{mode}@{memory_fraction:g}"),
                known=Known(cache),
            )
            results.append(result)
            rows.append(
                AnalysisRow(
                    memory_fraction,
                    mode,
                    result.batch_size,
                    result.peak_bytes,
                    result.budget_bytes,
                    len(result.trials),
                    cache.runs - runs_before,
                    result.search_seconds,
                )
            )
    return Analysis(
        tuple(rows),
        trials_run=sum(cache.runs for cache in caches.values()),
        separate_trials=sum(row.trials for row in rows),
        traces_run=sum(cache.traces for cache in caches.values()),
        separate_traces=sum(len(result.predicted_trials) for result in results),
        results=tuple(results),
    )


def _check_arguments(
    memory_fractions: Sequence[float],
    sizes_by_mode: Mapping[Mode, BatchSizes] | None,
    trials_by_mode: Mapping[Mode, Trials] | None,
) -> None:
    """A ConfigurationError for analyze's fractions or per-mode mappings where one is not what it
    takes, naming what to pass."""
    by_mode = (("sizes_by_mode", sizes_by_mode, BatchSizes), ("trials_by_mode", trials_by_mode, Trials))
    for name, given, kind in by_mode:
        for value in (given or {}).values() if isinstance(given, Mapping) else ():
            check_option("analyze", f"{name}[mode]", value, kind)
        if given is not None and not isinstance(given, Mapping):
            raise ConfigurationError(
                f"analyze's {name} must be a mapping of mode to batchfit.{kind.__name__} (or None), "
                f"got {type_name(given)}; pass {name}={{'train': batchfit.{kind.__name__}(...)}}."
            )
    if not memory_fractions:
        raise ConfigurationError("memory_fractions is empty: give at least one, e.g. 0.6,0.8.")
    for fraction in memory_fractions:
        check_memory_fraction(fraction)


def _told(on_progress: OnProgress | None, label: str) -> OnProgress | None:
    """The progress callback, each trial told as analyze's under ``label``."""
    if on_progress is None:
        return None
    return lambda event: on_progress(event.relabelled("analyze", label))

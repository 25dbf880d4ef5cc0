"""The search outside training, across memory fractions and modes, sharing its measurements.

A trial's peak does not depend on the memory fraction, only its verdict; so every fraction after the
first reuses the trials (and fake-tensor traces) of the others and runs only what is new.
"""

from __future__ import annotations

import csv
import functools
import io
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from batchfit.checks import DEFAULT_MAX_BATCH_SIZE, default_max_batch_size
from batchfit.errors import ConfigurationError
from batchfit.find import SearchResult, find_batch_size
from batchfit.policy.trial import Mode, Trial
from batchfit.policy.trial_cache import TrialCache
from batchfit.runtime.workloads.workload import Workload
from batchfit.units import format_bytes

#: What ``Analysis.render`` writes: the report file's suffixes, and the table the CLI prints.
REPORT_FORMATS = ("json", "jsonl", "csv")


@dataclass(frozen=True)
class Bounds:
    """Where one mode's search looks: [min_batch_size, max_batch_size], steps_per_trial steps a trial."""

    min_batch_size: int = 1
    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE
    steps_per_trial: int = 2

    @classmethod
    def default(cls, mode: Mode) -> Bounds:
        return cls(max_batch_size=default_max_batch_size(mode))


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

    def to_dict(self) -> dict[str, Any]:
        return {
            "rows": [asdict(row) for row in self.rows],
            "trials_run": self.trials_run,
            "separate_trials": self.separate_trials,
            "traces_run": self.traces_run,
            "separate_traces": self.separate_traces,
            "device": self.results[0].device if self.results else None,  # with its cap, if any
        }

    def render(self, report_format: str) -> str:
        """The report as ``json``, ``jsonl`` (one row a line), ``csv`` or a ``table`` to read."""
        if report_format == "json":
            return json.dumps(self.to_dict(), indent=2) + "\n"
        if report_format == "jsonl":
            return "".join(json.dumps(asdict(row)) + "\n" for row in self.rows)
        if report_format == "csv":
            buffer = io.StringIO()
            writer = csv.DictWriter(buffer, fieldnames=list(AnalysisRow.__dataclass_fields__))
            writer.writeheader()
            writer.writerows(asdict(row) for row in self.rows)
            return buffer.getvalue()
        if report_format == "table":
            return self.table()
        raise ConfigurationError(
            f"report_format={report_format!r}: use one of {', '.join(REPORT_FORMATS)} or table."
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
    modes: Sequence[Mode] = ("train", "eval"),
    *,
    bounds: Mapping[Mode, Bounds] | None = None,
    device: str | None = None,
    memory_limit: str | int | None = None,
    on_trial: Callable[[float, Mode, Trial], None] | None = None,
) -> Analysis:
    """One search per (memory_fraction, mode); each mode's searches share one cache of measurements."""
    if not memory_fractions:
        raise ConfigurationError("memory_fractions is empty: give at least one, e.g. 0.6,0.8.")
    rows, results = [], []
    caches = {mode: TrialCache() for mode in modes}
    for mode in modes:
        limits = (bounds or {}).get(mode) or Bounds.default(mode)
        cache = caches[mode]
        for memory_fraction in memory_fractions:
            runs_before = cache.runs
            result = find_batch_size(
                workload,
                mode,
                device=device,
                memory_limit=memory_limit,
                memory_fraction=memory_fraction,
                min_batch_size=limits.min_batch_size,
                max_batch_size=limits.max_batch_size,
                steps_per_trial=limits.steps_per_trial,
                cache=cache,
                on_trial=None if on_trial is None else functools.partial(on_trial, memory_fraction, mode),
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

"""The search outside training, across memory fractions and modes, sharing its measurements.

A trial's peak does not depend on the fraction, only its verdict; so every fraction after the
first reuses the trials (and fake-tensor traces) of the others and runs only what is new.
"""

from __future__ import annotations

import csv
import functools
import io
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from batchfit.errors import ConfigurationError
from batchfit.find import SearchResult, find_batch_size
from batchfit.search import Trial
from batchfit.trial import Mode, TrialCache
from batchfit.workload import Workload


@dataclass(frozen=True)
class Bounds:
    """Where one mode's search looks: [min_batch, max_batch], steps_per_trial steps a trial."""

    min_batch: int = 1
    max_batch: int = 512
    steps_per_trial: int = 2


@dataclass(frozen=True)
class AnalysisRow:
    fraction: float
    mode: Mode
    batch_size: int
    peak_bytes: int
    limit_bytes: int  # the budget: fraction x capacity
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
        }

    def render(self, suffix: str) -> str:
        """The report as ``.json``, ``.jsonl`` (one row a line) or ``.csv``."""
        if suffix == ".json":
            return json.dumps(self.to_dict(), indent=2) + "\n"
        if suffix == ".jsonl":
            return "".join(json.dumps(asdict(row)) + "\n" for row in self.rows)
        if suffix == ".csv":
            buffer = io.StringIO()
            writer = csv.DictWriter(buffer, fieldnames=list(AnalysisRow.__dataclass_fields__))
            writer.writeheader()
            writer.writerows(asdict(row) for row in self.rows)
            return buffer.getvalue()
        raise ConfigurationError(f"--output must end in .json, .jsonl or .csv, got {suffix!r}.")

    def write(self, path: str | Path) -> None:
        path = Path(path)
        path.write_text(self.render(path.suffix.lower()))


def analyze(
    workload: Workload,
    fractions: Sequence[float],
    modes: Sequence[Mode] = ("train", "eval"),
    *,
    bounds: Mapping[Mode, Bounds] | None = None,
    device: str | None = None,
    memory_limit: str | int | None = None,
    on_trial: Callable[[float, Mode, Trial], None] | None = None,
) -> Analysis:
    """One search per (fraction, mode); each mode's searches share one cache of measurements."""
    if not fractions:
        raise ConfigurationError("fractions is empty: give at least one, e.g. 0.6,0.8.")
    rows, results = [], []
    caches = {mode: TrialCache() for mode in modes}
    for mode in modes:
        limits = (bounds or {}).get(mode, Bounds(max_batch=512 if mode == "train" else 1024))
        cache = caches[mode]
        for fraction in fractions:
            runs_before = cache.runs
            result = find_batch_size(
                workload,
                mode,
                device=device,
                memory_limit=memory_limit,
                fraction=fraction,
                min_batch=limits.min_batch,
                max_batch=limits.max_batch,
                steps_per_trial=limits.steps_per_trial,
                cache=cache,
                on_trial=None if on_trial is None else functools.partial(on_trial, fraction, mode),
            )
            results.append(result)
            rows.append(
                AnalysisRow(
                    fraction,
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

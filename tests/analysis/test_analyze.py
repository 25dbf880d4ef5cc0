"""Analysis across fractions: shared measurements, reports that parse, answers that agree with find."""

from __future__ import annotations

import csv
import io
import json

import pytest
from tiny_workloads import untraceable

from batchfit import find_batch_size
from batchfit.analysis.analyze import Analysis, analyze
from batchfit.errors import ConfigurationError
from batchfit.runtime.workloads.examples import build_example


def test_fractions_share_their_trials() -> None:
    analysis = analyze(untraceable("cnn"), [0.6, 0.8, 1.0], ["train"], device="cpu", memory_limit=3_000_000)
    assert analysis.traces_run == 0
    separate = [
        find_batch_size(untraceable("cnn"), device="cpu", memory_limit=3_000_000, memory_fraction=fraction)
        for fraction in (0.6, 0.8, 1.0)
    ]
    # The same answers as separate searches, for fewer real trials.
    assert [row.batch_size for row in analysis.rows] == [result.batch_size for result in separate]
    assert analysis.separate_trials == sum(len(result.trials) for result in separate)
    assert analysis.trials_run < analysis.separate_trials
    assert sum(row.new_trials for row in analysis.rows) == analysis.trials_run
    assert analysis.rows[1].new_trials < analysis.rows[1].trials  # 2 and 4 were measured for 0.6


def test_rows_agree_with_find_and_reports_parse() -> None:
    analysis = analyze(
        build_example("cnn", "cpu"), [0.6, 0.9], ["train", "eval"], device="cpu", memory_limit="64MiB"
    )
    assert [(row.memory_fraction, row.mode) for row in analysis.rows] == [
        (0.6, "train"),
        (0.9, "train"),
        (0.6, "eval"),
        (0.9, "eval"),
    ]
    for row in analysis.rows:
        alone = find_batch_size(
            build_example("cnn", "cpu"),
            row.mode,
            device="cpu",
            memory_limit="64MiB",
            memory_fraction=row.memory_fraction,
        )
        assert (row.batch_size, row.peak_bytes, row.budget_bytes) == (
            alone.batch_size,
            alone.peak_bytes,
            alone.budget_bytes,
        )
    _check_reports(analysis)


def _check_reports(analysis: Analysis) -> None:
    document = json.loads(analysis.to_json())
    assert len(document["rows"]) == len(analysis.rows) and document["trials_run"] == analysis.trials_run
    lines = [json.loads(line) for line in analysis.to_jsonl().splitlines()]
    assert lines == document["rows"]
    table = list(csv.DictReader(io.StringIO(analysis.to_csv())))
    assert [int(row["batch_size"]) for row in table] == [row.batch_size for row in analysis.rows]
    assert set(table[0]) == {
        "memory_fraction",
        "mode",
        "batch_size",
        "peak_bytes",
        "budget_bytes",
        "trials",
        "new_trials",
        "seconds",
    }
    assert analysis.table().splitlines()[0].split() == [
        "fraction",
        "mode",
        "batch_size",
        "peak",
        "budget",
        "trials",
        "seconds",
    ]
    assert len(analysis.table().splitlines()) == len(analysis.rows) + 1


def test_no_fractions() -> None:
    with pytest.raises(ConfigurationError, match="fractions is empty"):
        analyze(build_example("mlp", "cpu"), [], device="cpu", memory_limit="40MiB")

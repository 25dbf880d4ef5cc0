"""The report's pages for analyze, compare, check-data and advise, rendered from real results on the
capped CPU: one plot per part, and every number in the plots' labels is the result's."""

from __future__ import annotations

from typing import Any

from test_report import Page

from batchfit import Timing
from batchfit.comparison.compare import compare
from batchfit.policy.explore.advice import Change
from batchfit.policy.explore.loader_settings import LoaderSetting
from batchfit.report import SavedResult, recognise, render_report
from batchfit.runtime.workloads.examples import build_example


def only_section(document: dict[str, Any], kind: str) -> dict[str, Any]:
    assert recognise(document) == kind
    text = render_report([SavedResult(recognise(document), document, f"{kind}.json")])
    assert "http://" not in text and "https://" not in text
    [section] = Page(text).sections
    assert section["kind"] == f"result {kind}"
    assert section["what_ran"]["command"] == f"batchfit {kind}"
    return section


def test_analyze_page_plots_batch_size_by_fraction_per_mode(analyze_result: SavedResult) -> None:
    document = analyze_result.document
    section = only_section(document, "analyze")
    assert section["svgs"] == 1
    assert section["what_ran"]["device"] == "cpu (capped at 64.00 MiB)"
    rows = document["rows"]
    assert {(row["mode"], row["memory_fraction"]) for row in rows} == {
        (mode, fraction) for mode in ("train", "eval") for fraction in (0.6, 0.8)
    }
    texts = section["texts"]
    for row in rows:
        assert str(row["batch_size"]) in texts  # each point labelled with its batch
    assert {"train", "eval", "0.6", "0.8"} <= set(texts)


def times(ratio: float | None) -> str:
    return "" if ratio is None else f" ({ratio:.2f}x)"


def test_compare_page_plots_each_technique_against_the_baseline(compare_result: SavedResult) -> None:
    document = compare_result.document
    section = only_section(document, "compare")
    assert section["svgs"] == 1  # largest batch and throughput side by side
    texts = section["texts"]
    rows = document["rows"]
    assert [row["technique"] for row in rows] == ["baseline", "amp", "checkpointing", "accumulation"]
    for row in rows:
        assert row["technique"] in texts
        assert row["applied"] and not row["at_max_batch_size"]
        batch = (">=" if row["at_max_batch_size"] else "") + str(row["batch_size"])
        batch += f"x{row['accumulation_steps']}" if row["accumulation_steps"] else ""
        assert batch + times(row["batch_ratio"]) in texts
        assert f"{row['samples_per_second']:.1f}" + times(row["throughput_ratio"]) in texts
    assert rows[0]["batch_ratio"] == rows[0]["throughput_ratio"] == 1.0
    assert rows[3]["accumulation_steps"] and rows[3]["batch_ratio"] is None  # a micro-batch: no ratio
    assert section["lists"]["compare-notes"] == [f"{row['technique']}: {row['note']}" for row in rows]


def test_a_technique_that_cannot_apply_says_why_on_the_page() -> None:
    comparison = compare(
        build_example("mlp", "cpu"),
        ["baseline", "checkpointing"],
        device="cpu",
        memory_limit="48MiB",
        timing=Timing(windows=1, time_budget_seconds=0),
    )
    section = only_section(comparison.to_dict(), "compare")
    refused = comparison.rows[1]
    assert not refused.applied
    assert "cannot apply (see below)" in section["texts"] and "not measured" in section["texts"]
    assert f"checkpointing: cannot apply: {refused.note}" in section["lists"]["compare-notes"]


def test_check_data_page_plots_each_settings_wait_and_speed(check_data_result: SavedResult) -> None:
    document = check_data_result.document
    section = only_section(document, "check-data")
    assert section["svgs"] == 1
    texts = section["texts"]
    settings = document["settings"]
    assert len(settings) >= 2 and document["recommendation"] is not None  # the loader waited
    chosen = LoaderSetting(**document["recommendation"]["setting"])
    for index, row in enumerate(settings):
        setting = LoaderSetting(**{key: row[key] for key in LoaderSetting.__dataclass_fields__})
        marks = (["current"] if index == 0 else []) + (["recommended"] if setting == chosen else [])
        assert setting.describe() + (f" ({', '.join(marks)})" if marks else "") in texts
        assert f"{row['data_wait_share']:.1%} wait" in texts
        assert f"{row['samples_per_second']:.1f}" in texts
    assert f"loader alone {document['loader_samples_per_second']:.1f}" in texts
    assert f"step alone {document['step_samples_per_second']:.1f}" in texts
    assert f"samples/s training at batch_size={document['batch_size']}" in texts
    assert section["lists"]["check-data-notes"][0] == document["summary"]


def test_advise_page_holds_the_changes_and_each_steps_plots(advise_result: SavedResult) -> None:
    document = advise_result.document
    section = only_section(document, "advise")
    assert document["data"] is None  # the example has no dataset: check-data is skipped
    assert section["svgs"] == 4  # find (train and eval), explore, compare, plan
    lines = [Change(**change).line(document["context"]) for change in document["changes"]]
    assert section["lists"]["advise-changes"] == (lines or ["nothing measured is worth it"])
    assert section["lists"]["advise-skipped"] == document["skipped"]
    texts = section["texts"]
    train, evaluation = document["train"], document["eval"]
    assert f"train: batch_size={train['batch_size']}" in texts
    assert f"eval: batch_size={evaluation['batch_size']}" in texts
    recommended = document["exploration"]["recommendation"]["batch_size"]
    assert f"recommended batch_size={recommended}" in texts
    assert f"learning_rate={document['plan']['learning_rate']:g}: warm-up, then constant" in texts
    assert section["what_ran"]["device"] == "cpu (capped at 48.00 MiB)"

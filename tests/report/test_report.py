"""The HTML report, rendered from real results of the built-in examples on the capped CPU: the page
parses, holds one plot per part, states what ran, names no URL, and its labels show the result's numbers."""

from __future__ import annotations

import json
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
import torch

import batchfit
from batchfit import BatchSizes, Timing
from batchfit.errors import ConfigurationError
from batchfit.exploration.explore import explore
from batchfit.policy.plan.plan import plan
from batchfit.policy.plan.plan_options import Baseline
from batchfit.report import (
    SavedResult,
    legacy_kind,
    noise_plots,
    read_result,
    recognise,
    render_report,
    saved_result,
)
from batchfit.runtime.workloads.examples import build_example
from batchfit.units import format_bytes


class Page(HTMLParser):
    """The parts of a report page the tests read: sections, their what-ran cells, svgs, texts and
    lists (by the class of their div)."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.sections: list[dict[str, Any]] = []
        self._cell: str | None = None
        self._in_svg_text = False
        self._list: list[str] = []  # the items of the list being read
        self._in_item = False
        self.feed(text)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = dict(attrs)
        if tag == "section":
            self.sections.append(
                {"kind": attributes["class"], "what_ran": {}, "svgs": 0, "texts": [], "lists": {}}
            )
        elif tag == "div" and attributes.get("class"):
            self._list = self.sections[-1]["lists"].setdefault(attributes["class"], [])
        elif tag == "li":
            self._list.append("")
            self._in_item = True
        elif tag == "svg":
            self.sections[-1]["svgs"] += 1
        elif tag == "td" and attributes.get("class"):
            self._cell = attributes["class"]
        elif tag == "text":
            self._in_svg_text = True

    def handle_endtag(self, tag: str) -> None:
        if tag == "td":
            self._cell = None
        elif tag == "text":
            self._in_svg_text = False
        elif tag == "li":
            self._in_item = False

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self.sections[-1]["what_ran"][self._cell] = data
        if self._in_svg_text:
            self.sections[-1]["texts"].append(data)
        if self._in_item:
            self._list[-1] += data


def test_find_page_plots_train_and_eval_with_the_results_numbers(find_document: dict[str, Any]) -> None:
    text = render_report([SavedResult("find", find_document, "find.json")])
    page = Page(text)
    [section] = page.sections
    assert section["kind"] == "result find"
    assert section["svgs"] == 1  # train and eval side by side in one plot
    assert section["what_ran"] == {
        "command": "batchfit find",
        "workload": "mlp",
        "device": "cpu (capped at 48.00 MiB)",
        "torch": torch.__version__,
        "batchfit": batchfit.__version__,
        "time": "2025-01-01T00:00:00+00:00",
    }
    assert "http://" not in text and "https://" not in text
    texts = section["texts"]
    for result in find_document["results"]:
        assert {trial["outcome"] for trial in result["trials"]} == {"ok", "oom"}
        assert f"{result['mode']}: batch_size={result['batch_size']}" in texts
        assert f"answer batch_size={result['batch_size']}" in texts
        budget = f"budget {format_bytes(result['budget_bytes'])} ({result['memory_fraction']:g} x capacity)"
        assert budget in texts
        assert f"capacity {format_bytes(result['capacity_bytes'])}" in texts
    assert {"ok", "oom (the peak before it failed)", "forecast (traced)", "fitted: forward/backward"} <= set(
        texts
    )


def test_on_cuda_the_reserved_peaks_are_drawn_beside_the_allocated(find_document: dict[str, Any]) -> None:
    # The CPU records no reserved bytes; a CUDA trial does (what the caching allocator held).
    results = [
        {
            **result,
            "trials": [{**t, "reserved_peak_bytes": t["peak_bytes"] + 2**20} for t in result["trials"]],
        }
        for result in find_document["results"]
    ]
    plain = Page(render_report([SavedResult("find", find_document, "cpu.json")])).sections[0]["texts"]
    cuda = Page(render_report([SavedResult("find", {**find_document, "results": results}, "cuda.json")]))
    assert "reserved (caching allocator)" not in plain
    assert cuda.sections[0]["texts"].count("reserved (caching allocator)") == 2  # train and eval


def test_a_saved_find_result_is_read_back_and_recognised(
    find_document: dict[str, Any], tmp_path: Any
) -> None:
    path = tmp_path / "find.json"
    path.write_text(json.dumps(find_document))
    result = read_result(path)
    assert (result.kind, result.document, result.source) == ("find", find_document, str(path))


#: What ``batchfit find --format json`` wrote before the envelope (at 7073f95): what ran and the
#: searches merged at the top level, no ``command``.
BEFORE_ENVELOPE = Path(__file__).resolve().parent / "data" / "find-before-envelope.json"


def test_a_file_from_before_the_envelope_is_read_by_its_keys_and_drawn() -> None:
    old = json.loads(BEFORE_ENVELOPE.read_text())
    assert "command" not in old and "versions" not in old
    assert legacy_kind(old) == recognise(old) == "find"
    result = read_result(BEFORE_ENVELOPE)
    assert (result.kind, result.document) == ("find", old)
    [section] = Page(render_report([result])).sections
    assert section["what_ran"] == {
        "command": "batchfit find",
        "workload": "mlp",
        "device": "cpu (capped at 48.00 MiB)",
        "torch": old["torch_version"],
        "batchfit": old["batchfit_version"],
        "time": old["created_at"],
    }
    assert f"answer batch_size={old['results'][0]['batch_size']}" in section["texts"]


def test_an_envelope_is_read_by_its_command_not_its_keys(plan_result: SavedResult) -> None:
    # Every envelope holds find's old keys (workload, results): by its keys, plan's is find's.
    envelope = {"command": "plan", "workload": None, "results": [dict(plan_result.document)]}
    assert legacy_kind(envelope) == "find" and recognise(envelope) == "plan"
    saved = saved_result(envelope)
    assert saved.kind == "plan" and saved.document["global_batch_size"] == 1024


def test_a_document_that_is_no_result_is_refused_with_the_keys_a_report_needs() -> None:
    with pytest.raises(ConfigurationError) as error:
        recognise({"batch_size": 8}, "x.json")
    assert str(error.value) == (
        "x.json is not a saved batchfit result: its keys (batch_size) are not those of any command's JSON "
        "output (advise, find, explore, plan, analyze, compare, check-data, noise-scale, predict) or of "
        "bench/noise_prediction.py's results file. Save one with --format json --output FILE (analyze: "
        "--output FILE.json)."
    )


def test_what_was_not_recorded_is_said(find_document: dict[str, Any]) -> None:
    bare = {"workload": "mlp", "results": find_document["results"]}
    page = Page(render_report([SavedResult("find", bare, "old.json")]))
    assert page.sections[0]["what_ran"]["torch"] == "not recorded"
    assert page.sections[0]["what_ran"]["time"] == "not recorded"


def test_plan_page_plots_the_learning_rate_with_the_plans_numbers() -> None:
    result = plan(1024, Baseline(0.1, 256), world_size=8, max_micro_batch_size=48)
    document = {**json.loads(result.to_json()), "batchfit_version": batchfit.__version__}
    assert recognise(document) == "plan"
    text = render_report([SavedResult("plan", document, "plan.json")])
    [section] = Page(text).sections
    assert section["svgs"] == 1
    assert section["what_ran"]["command"] == "batchfit plan"
    assert section["what_ran"]["batchfit"] == batchfit.__version__
    assert section["what_ran"]["device"] == "not recorded"  # plan runs no model
    assert f"learning_rate={result.learning_rate:g}: warm-up, then constant" in section["texts"]
    assert f"warmup_steps={result.warmup_steps}" in section["texts"]
    assert f"global_batch_size=1024: learning_rate={result.learning_rate:g}" in section["texts"]
    assert "http://" not in text and "https://" not in text


def test_one_page_holds_a_section_per_result_in_order(find_document: dict[str, Any]) -> None:
    planned = json.loads(plan(64, Baseline(0.1, 32), micro_batch_size=32).to_json())
    results = [SavedResult("plan", planned, "p.json"), SavedResult("find", find_document, "f.json")]
    page = Page(render_report(results))
    assert [(section["kind"], section["svgs"]) for section in page.sections] == [
        ("result plan", 1),
        ("result find", 1),
    ]


def test_explore_page_plots_throughput_and_confidence_with_the_results_numbers() -> None:
    result = explore(
        build_example("mlp", "cpu"),
        device="cpu",
        sizes=BatchSizes(max_batch_size=64),
        timing=Timing(time_budget_seconds=1),
    )
    document = {**json.loads(result.to_json()), "tolerance": 0.03}
    assert recognise(document) == "explore"
    text = render_report([SavedResult("explore", document, "explore.json")])
    [section] = Page(text).sections
    assert section["svgs"] == 1
    recommended = result.recommendation
    assert f"recommended batch_size={recommended.batch_size}" in section["texts"]
    assert (
        f"recommended batch_size={recommended.batch_size} ({recommended.speedup:.2f}x base)"
        in section["texts"]
    )
    assert f"confidence {recommended.confidence} at the end" in section["texts"]
    assert "tolerance 0.03 under the best" in section["texts"]
    assert section["what_ran"]["device"] == "cpu"  # explore's result records the device it timed
    assert "http://" not in text and "https://" not in text


def test_an_exploration_given_a_noise_scale_plots_throughput_efficiency_and_goodput(
    explore_goodput_result: SavedResult,
) -> None:
    document = explore_goodput_result.document
    goodput = document["goodput"]
    text = render_report([explore_goodput_result])
    [section] = Page(text).sections
    assert section["svgs"] == 2  # explore's own plot, then goodput's
    texts = section["texts"]
    assert f"time-optimal batch_size={goodput['time_optimal']} (the highest goodput)" in texts
    for key, label in (
        ("time_optimal", "time-optimal"),
        ("fastest", "fastest"),
        ("largest", "largest measured"),
    ):
        assert f"{label} batch_size={goodput[key]}" in texts
    assert {
        "statistical efficiency",
        "goodput: throughput x efficiency",
        "samples 10% above the fewest",
    } <= set(texts)
    assert {"noise scale 24", "its 90% interval [12, 48]", "efficiency at noise scale 24"} <= set(texts)
    assert section["lists"]["goodput-notes"] == goodput["lines"]
    assert "http://" not in text and "https://" not in text


def test_an_exploration_without_a_noise_scale_has_no_goodput_plot(explore_result: SavedResult) -> None:
    assert explore_result.document["goodput"] is None
    [section] = Page(render_report([explore_result])).sections
    assert section["svgs"] == 1 and "goodput-notes" not in section["lists"]


def test_a_noise_scale_result_plots_each_step_s_readings_and_the_running_estimate(
    noise_scale_result: SavedResult,
) -> None:
    document = noise_scale_result.document
    assert recognise(document) == "noise-scale"
    scale = document["noise_scale"]
    readings = noise_plots.readings_of(document)
    so_far = noise_plots.running(readings)
    assert len(so_far) == scale["steps"] == 8
    assert so_far[-1].b_simple == pytest.approx(scale["b_simple"], rel=1e-12)  # the saved estimate
    [section] = Page(render_report([noise_scale_result])).sections
    assert section["svgs"] == 1
    assert section["what_ran"]["command"] == "batchfit noise-scale"
    texts = section["texts"]
    assert f"B_simple = {scale['b_simple']:.4g}" in texts
    assert f"|G|^2 estimate per step: {scale['gradient_norm_sq']:.4g} over 8" in texts
    assert f"tr(Sigma) estimate per step: {scale['trace_sigma']:.4g} over 8" in texts
    assert {"B_simple so far", "its 90% interval", "|G|^2, one step", "tr(Sigma), mean so far"} <= set(texts)
    assert section["lists"]["noise-scale-notes"] == [
        f"B_simple {scale['b_simple']:.4g}",
        "from 8 steps (training), batch 64 against 16",
        f"meaning: {scale['meaning']}",
    ]


def test_the_noise_prediction_file_plots_the_measured_steps_against_the_fitted_curve(
    noise_prediction_result: SavedResult,
) -> None:
    document = noise_prediction_result.document
    assert recognise(document) == "noise-prediction"
    found, (low, high) = document["fit"], document["intervals"]["b_crit"]
    [section] = Page(render_report([noise_prediction_result])).sections
    assert section["svgs"] == 1
    assert section["what_ran"]["command"] == document["command"]  # the bench's, not a subcommand
    assert section["what_ran"]["torch"] == document["torch"]
    assert section["what_ran"]["time"] == document["written"]
    texts = section["texts"]
    assert f"fitted S(B) = {found['s_min']:.0f} (1 + {found['b_crit']:.0f} / B)" in texts
    assert f"B_crit = {found['b_crit']:.0f}" in texts
    assert f"its 90% interval [{low:.0f}, {high:.0f}]" in texts
    assert f"B_simple early = {found['b_simple_early']:.0f}" in texts
    assert f"B_crit / B_simple early = {found['b_crit'] / found['b_simple_early']:.2f}" in texts
    assert section["lists"]["noise-prediction-notes"] == document["lines"]


def test_predict_page_plots_each_answer_by_capacity_with_the_recorded_trials(
    predict_result: SavedResult,
) -> None:
    prediction = predict_result.document["prediction"]
    assert recognise(predict_result.document) == "predict"
    text = render_report([predict_result])
    [section] = Page(text).sections
    assert section["kind"] == "result predict" and section["svgs"] == 1
    assert section["what_ran"]["device"] == prediction["device"]  # where the requests were recorded
    texts = section["texts"]
    answers = {
        (row["target"], mode): row[mode]["batch_size"]
        for row in prediction["rows"]
        for mode in ("train", "eval")
    }
    assert {str(answer) for answer in answers.values()} <= set(texts)  # each answer labelled
    assert answers[("16MiB", "train")] < answers[("48MiB", "train")] < answers[("64MiB", "train")]
    # The recording capacity is a tick of its own, with the trials measured there.
    assert "(recorded)" in texts and {"16 MiB", "24 MiB", "48 MiB", "64 MiB"} <= set(texts)
    recorded = prediction["recorded_trials"]["train"]
    assert [trial["outcome"] for trial in recorded] == ["ok", "ok", "oom"]
    assert {
        "train: recorded trial, fitted",
        "train: recorded trial, failed",
        "train: predicted, with its band",
    } <= set(texts)
    assert section["lists"]["predict-modelled"] == prediction["modelled"]
    assert "predict-unmodelled" not in section["lists"]  # recorded behind the allocator: nothing guessed
    assert "http://" not in text and "https://" not in text


def test_a_prediction_from_the_cpu_alone_names_what_it_does_not_model_and_plots_no_recorded_trials(
    predict_result: SavedResult,
) -> None:
    prediction = {
        **predict_result.document["prediction"],
        "cpu_alone": True,
        "unmodelled": [{"part": "cuDNN's convolution workspaces", "share": 0.03, "measured": False}],
    }
    [section] = Page(render_report([SavedResult("predict", {"prediction": prediction}, "p.json")])).sections
    assert section["lists"]["predict-unmodelled"] == [
        "cuDNN's convolution workspaces: 3% of the budget either way (a guess)"
    ]
    assert "(recorded)" not in section["texts"]  # the CPU's capacity is no GPU's
    assert not any("recorded trial" in text for text in section["texts"])

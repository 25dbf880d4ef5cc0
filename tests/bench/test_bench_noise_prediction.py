"""The noise scale's prediction bench: its fit recovers an exact S(B), its replay finds the same first
crossing as evaluating every step, and its quick run writes a file that the docs' table and the
report both draw."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

# bench/ is a directory of scripts, not a package: its directory goes on the path.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import _noise_task
import noise_prediction
import tables

from batchfit.report import read_result, render_report


@pytest.mark.parametrize(("s_min", "b_crit"), [(100.0, 300.0), (40.0, 2000.0), (250.0, 16.0)])
def test_the_fit_recovers_s_min_and_b_crit_from_exact_steps(s_min: float, b_crit: float) -> None:
    sizes = [32, 64, 128, 256, 512, 1024, 2048]
    steps = [s_min * (1 + b_crit / size) for size in sizes]
    assert noise_prediction.fit(sizes, steps) == pytest.approx((s_min, b_crit), rel=1e-9)
    # A batch whose runs never reached the target (infinite median) is left out of the fit.
    with_missing = noise_prediction.fit([*sizes, 16], [*steps, math.inf])
    assert with_missing == pytest.approx((s_min, b_crit), rel=1e-9)


def test_the_replayed_first_crossing_is_the_one_evaluating_every_step_finds() -> None:
    task, target = _noise_task.Task(), 2.0
    found = _noise_task.steps_to_target(_noise_task.Run(task, 0, 64, 0.5), target, 500)
    every = _noise_task.Run(task, 0, 64, 0.5)
    while task.loss(every.model) > target:
        every.step()
    assert found == every.steps and found % _noise_task.EVALUATE_EVERY != 0  # found inside a stride


def test_a_run_that_cannot_reach_the_target_counts_as_never() -> None:
    task = _noise_task.Task()
    assert _noise_task.steps_to_target(_noise_task.Run(task, 0, 64, 0.5), 0.0, 40) is None
    assert noise_prediction.median_steps([10, None, None]) == math.inf


def test_the_quick_run_writes_a_file_the_table_and_the_report_draw(tmp_path: Path) -> None:
    path = tmp_path / "noise-prediction.json"
    noise_prediction.main(["--quick", "--json", str(path)])
    data = json.loads(path.read_text())
    assert [row["batch_size"] for row in data["rows"]] == [64, 512]
    assert all(len(row["steps"]) == 2 for row in data["rows"])
    for row in data["rows"]:  # the chosen rate is inside the rates tried, or the ladder's end
        tried = [rate["learning_rate"] for rate in row["sweep"]]
        assert min(tried) < row["learning_rate"] < max(tried)
    assert len(data["checkpoints"]) == 3 and data["checkpoints"][0]["step"] == 0
    found = data["fit"]
    assert data["ratios"]["early"] == pytest.approx(found["b_crit"] / found["b_simple_early"])
    assert data["lines"][2].startswith(f"B_crit / B_simple early = {data['ratios']['early']:.2f} (90%: ")
    table = tables.render(f"noise-prediction {path}")
    assert "| 64 | " in table and data["lines"][0] in table and "`python " in table
    page = render_report([read_result(path)])
    assert page.count("<svg") == 1 and f"B_crit = {found['b_crit']:.0f}" in page

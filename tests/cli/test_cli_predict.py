"""``batchfit predict`` in this process: its JSON, its table, an unknown card refused, and a model on
the meta device predicted as find's advice says."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from batchfit.cli import main


def test_predict_writes_the_prediction_as_json(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "predict",
            "--example",
            "cnn",
            "--device",
            "cpu",
            "--gpus",
            "T4",
            "--modes",
            "train",
            "--format",
            "json",
        ]
    )
    (prediction,) = json.loads(capsys.readouterr().out)["results"]
    assert code == 0
    (row,) = prediction["rows"]
    assert row["target"] == "T4" and row["eval"] is None and row["train"]["batch_size"] >= 1
    assert prediction["cpu_alone"] is True
    assert sorted(prediction["records"]["train"]) == ["2", "4", "8"]


def test_an_unknown_card_is_refused_before_any_work(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["predict", "--example", "cnn", "--device", "cpu", "--gpus", "B300"])
    assert code == 2
    assert "gpu='B300' is not a card batchfit knows" in capsys.readouterr().err


def test_a_meta_device_model_refused_by_find_is_predicted_as_its_advice_says(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("BATCHFIT_DEBUG", raising=False)
    monkeypatch.chdir(Path(__file__).resolve().parent)
    monkeypatch.setattr(sys, "path", list(sys.path))  # load_workload adds the working directory
    workload = ["--workload", "workloads_for_cli:tiny_on_meta", "--device", "cpu"]
    assert main(["find", *workload, "--memory-limit", "256KiB"]) == 2
    advice = "batchfit predict --device cpu --capacities 24GiB"
    assert f"({advice}), or build the model on cpu to measure it there." in capsys.readouterr().err
    # The advice, followed: exit 0 and a prediction for 24 GiB, traced from the shapes alone.
    assert main(["predict", *workload, "--capacities", "24GiB", "--modes", "train", "--format", "json"]) == 0
    (prediction,) = json.loads(capsys.readouterr().out)["results"]
    (row,) = prediction["rows"]
    assert prediction["cpu_alone"] is True and row["target"] == "24GiB" and row["train"]["batch_size"] >= 1

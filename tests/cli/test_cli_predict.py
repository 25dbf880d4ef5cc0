"""``batchfit predict`` in this process: its JSON, its table, and an unknown card refused."""

from __future__ import annotations

import json

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
    document = json.loads(capsys.readouterr().out)
    assert code == 0
    (row,) = document["prediction"]["rows"]
    assert row["target"] == "T4" and row["eval"] is None and row["train"]["batch_size"] >= 1
    assert document["prediction"]["cpu_alone"] is True
    assert sorted(document["prediction"]["records"]["train"]) == ["2", "4", "8"]


def test_an_unknown_card_is_refused_before_any_work(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["predict", "--example", "cnn", "--device", "cpu", "--gpus", "B300"])
    assert code == 2
    assert "gpu='B300' is not a card batchfit knows" in capsys.readouterr().err

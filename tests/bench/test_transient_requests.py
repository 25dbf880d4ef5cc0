"""The requests CUDA's recorded histories free before the next (bench/transient_requests.py), with the
figures docs/predict.md states."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import transient_requests

RESULTS = (
    Path(__file__).resolve().parents[2] / "bench" / "data" / "cpu-2026-11-28" / "transient-requests.json"
)


def test_a_request_freed_before_the_next_is_transient() -> None:
    entries = [
        "alloc 10 512 0",
        "free_requested 10 512 0",  # freed at once: transient
        "free_completed 10 512 0",
        "alloc 20 1000 0",
        "alloc 30 426000 0",
        "segment_alloc 40 2097152 0",  # not a request
        "free_requested 30 426000 0",  # transient, across a segment's allocation
        "free_requested 20 1000 0",  # another request came between: kept
    ]
    assert transient_requests.transient(entries) == [512, 426000]


def test_the_h200_s_histories_read_as_the_docs_say() -> None:
    rows = transient_requests.rows()
    assert json.loads(RESULTS.read_text())["rows"] == rows
    resnet50 = [row for row in rows if row["workload"] == "resnet50"]
    assert [row["transient"] for row in resnet50] == [188, 212, 218]
    assert [round(row["largest_bytes"] / 2**20, 1) for row in resnet50] == [12.7, 21.9, 40.3]
    assert [row["transient"] for row in rows if row["workload"] == "cnn"] == [6, 8, 10]

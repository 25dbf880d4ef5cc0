"""`batchfit explore` end to end in a subprocess: live lines on stderr, JSON and CSV on stdout."""

from __future__ import annotations

import csv
import io
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

from batchfit.policy.explore.exploration import Rules
from batchfit.runtime.devices.host import PINNED_MALLOC

TESTS = Path(__file__).resolve().parent


def explore(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "batchfit",
            "explore",
            "--workload",
            "workloads_for_cli:tiny",
            "--device",
            "cpu",
            "--max-batch-size",
            "32",
            "--windows",
            "2",
            "--steps-per-window",
            "1",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=TESTS,
        check=False,
        env=env,
    )


def test_json_and_live_recommendations() -> None:
    done = explore("--format", "json", "--world-size", "2", "--global-batch-size", "48")
    assert done.returncode == 0, done.stderr
    (document,) = json.loads(done.stdout)["results"]
    batches = [point["batch_size"] for point in document["points"]]
    assert batches and all(24 % batch == 0 for batch in batches)  # 48 / 2 devices
    # --windows 2 each, but 1 for a size whose first read below Rules().far_below of a larger one's median.
    for point in document["points"]:
        larger = [
            statistics.median(p["samples_per_second"])
            for p in document["points"]
            if p["batch_size"] > point["batch_size"]
        ]
        if len(point["samples_per_second"]) == 1:
            assert point["samples_per_second"][0] < Rules().far_below * max(larger)
    assert len(document["points"][-1]["samples_per_second"]) >= 2
    # Each new recommendation, settled or a leaning (under the confidence floor, the line says so).
    heads = ("batchfit: Current recommended micro_batch_size:", "batchfit: No micro_batch_size settled:")
    live = [line for line in done.stderr.splitlines() if line.startswith(heads)]
    if document["unsettled"] is None:
        assert len(live) == len(document["history"]) >= len(batches)
        assert live[-1].endswith(f"confidence score: {document['recommendation']['confidence']} (out of 100)")
    else:  # and once more after the stop, with what was measured and what would settle it
        assert len(live) == len(document["history"]) + 1 and "; measured " in live[-1]
    assert document["recommendation"]["batch_size"] in batches and document["unit"] == "samples/s"


def test_csv_and_bad_input() -> None:
    done = explore("--format", "csv", "--time-budget-seconds", "0")
    assert done.returncode == 0, done.stderr
    rows = list(csv.DictReader(io.StringIO(done.stdout)))
    # The budget allows only the first point: the coarse pass starts at the bound. Confidence 0 is
    # no answer: stderr says what was measured and about how long would settle it.
    assert len(rows) == 1 and rows[0]["batch_size"] == "32"
    said = done.stderr.splitlines()
    stopped = next(
        index for index, line in enumerate(said) if line.startswith("batchfit: stopped (time_budget)")
    )
    assert said[stopped + 1].startswith(
        "batchfit: No micro_batch_size settled: leaning to 32, estimated performance: 1.00x base, confidence "
        "score: 0 (out of 100), below 50: the measurements do not yet tell the sizes apart; measured 32; "
        "about "
    )
    bad = explore("--world-size", "8", "--global-batch-size", "1001")
    assert bad.returncode == 2 and bad.stderr.startswith(
        "batchfit: error: global_batch_size (1001) is not divisible by world_size (8); "
        "1000 or 1008 would work."
    )


def test_note_on_glibc_malloc_only_while_its_thresholds_move() -> None:
    unpinned = {*PINNED_MALLOC, "GLIBC_TUNABLES"}
    native = {key: value for key, value in os.environ.items() if key not in unpinned}
    moving = explore("--time-budget-seconds", "0", env=native)
    assert moving.returncode == 0, moving.stderr
    pinned = explore("--time-budget-seconds", "0", env={**native, **PINNED_MALLOC})
    assert pinned.returncode == 0, pinned.stderr
    assert "MALLOC_MMAP_THRESHOLD_" not in pinned.stderr
    if platform.libc_ver()[0] == "glibc":
        assert "batchfit: note: glibc's malloc moves its thresholds" in moving.stderr
        assert " ".join(f"{key}={value}" for key, value in PINNED_MALLOC.items()) in moving.stderr
        # before the first recommendation (here a leaning: the budget allows one size)
        assert moving.stderr.index("note:") < moving.stderr.index("estimated performance:")
    else:
        assert "glibc" not in moving.stderr


def test_without_a_bound_the_search_for_the_maximum_prints_its_trials_first() -> None:
    argv = ["--example", "cnn", "--device", "cpu", "--memory-limit", "64MiB", "--windows", "2"]
    argv += ["--steps-per-window", "1", "--time-budget-seconds", "1", "--format", "json"]
    done = subprocess.run(
        [sys.executable, "-m", "batchfit", "explore", *argv],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=TESTS,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    (document,) = json.loads(done.stdout)["results"]
    lines = done.stderr.splitlines()
    trials = [line for line in lines if line.startswith("batchfit: train batch_size=")]
    first_live = next(i for i, line in enumerate(lines) if "estimated performance:" in line)  # 1 s: a leaning
    assert trials and all(lines.index(line) < first_live for line in trials)  # the search, then the timing
    answer = [line for line in trials if line.split()[3] == "ok"][-1]
    assert answer.split()[2] == f"batch_size={document['max_batch_size']}"
    assert any(line.split()[3] == "oom" for line in trials)  # a real boundary under the cap


def test_a_noise_scale_adds_the_goodput_table_and_a_bad_one_is_refused_before_any_work() -> None:
    done = explore("--noise-scale", "8", "--sample-tolerance", "0.5", "--time-budget-seconds", "1")
    assert done.returncode == 0, done.stderr
    throughput, goodput = done.stdout.split("\n\n")
    assert throughput.startswith("batch_size     samples/s    raw median")
    lines = goodput.splitlines()
    assert lines[0] == "goodput at noise scale 8 (given); time, samples and steps to a target:"
    assert any(line.startswith("time-optimal batch_size ") for line in lines)
    assert lines[-1] == (
        "the noise scale 8 has no interval: the choice is as sure as that number (a measured noise "
        "scale of 3 or more steps gives one)"
    )
    bad = explore("--noise-scale", "-1")
    assert bad.returncode == 2 and bad.stderr.startswith(
        "batchfit: error: noise_scale must be a positive number of samples (inf: the noise hid the "
        "signal), got -1.0;"
    )

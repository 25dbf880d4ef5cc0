"""``batchfit compare`` run for real: the JSON rows, the progress lines, a bad technique."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tiny_workloads import blocks_cnn

from batchfit import Timing
from batchfit.comparison.compare import compare

#: The CLI imports ``--workload`` modules from its working directory: tests/, for tiny_workloads.
TESTS = Path(__file__).resolve().parents[1]
#: The example cnn's shape, small: its amp row trains under autocast, about 20x slower on a CPU
#: without bfloat16 kernels.
ARGS = (
    "--workload",
    "tiny_workloads:blocks_cnn",
    "--device",
    "cpu",
    "--memory-limit",
    "4MiB",
    "--windows",
    "1",
    "--time-budget-seconds",
    "0",
    "--time-slow",
)


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "batchfit", "compare", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=TESTS,
        check=False,
    )


def test_compare_prints_rows_as_json_and_a_line_per_setting() -> None:
    done = run(
        *ARGS, "--techniques", "amp,cudnn-benchmark-on", "--global-batch-size", "96", "--format", "json"
    )
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)["results"][0]["rows"]
    assert [row["technique"] for row in rows] == ["baseline", "amp", "cudnn-benchmark-on", "accumulation"]
    alone = compare(
        blocks_cnn(),
        ["amp"],
        device="cpu",
        memory_limit="4MiB",
        timing=Timing(windows=1, time_budget_seconds=0, time_slow=True),
    )
    assert [row["batch_size"] for row in rows[:2]] == [row.batch_size for row in alone.rows]
    assert rows[2]["applied"] is False and rows[2]["note"] == "cuDNN's benchmark needs CUDA"
    assert rows[3]["batch_size"] * rows[3]["accumulation_steps"] == 96
    said = [
        line for line in done.stderr.splitlines() if line.startswith("batchfit: ") and ": batch_size=" in line
    ]
    assert [line.split(":")[1].strip() for line in said] == ["baseline", "amp", "accumulation"]
    assert "batchfit: cudnn-benchmark-on: cuDNN's benchmark needs CUDA" in done.stderr


def test_a_bad_technique_is_one_message() -> None:
    done = run(*ARGS, "--techniques", "amp,turbo")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.startswith("batchfit: error: technique 'turbo': 'turbo' is not one of amp,")


def test_a_row_at_the_search_s_upper_bound_is_marked_as_a_lower_bound() -> None:
    done = run(
        "--example", "mlp", "--device", "cpu", "--memory-limit", "64MiB", "--windows", "1",
        "--time-budget-seconds", "0", "--time-slow", "--techniques", "amp", "--max-batch-size", "64",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    rows = [line.split() for line in done.stdout.splitlines()[1:3]]
    assert [row[:2] for row in rows] == [["baseline", ">=64"], ["amp", ">=64"]]
    assert ">=: the search reached max_batch_size; the largest batch is at least that." in done.stdout

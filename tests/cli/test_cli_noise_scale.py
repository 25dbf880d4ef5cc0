"""`batchfit noise-scale` end to end in a subprocess: the steps on stderr, the result on stdout as
text or JSON, and a refused size as one clean error."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def noise_scale(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "batchfit",
            "noise-scale",
            "--workload",
            "workloads_for_cli:tiny",
            "--device",
            "cpu",
            "--steps",
            "3",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=TESTS,
        check=False,
    )


def test_text_names_the_estimate_and_what_it_means() -> None:
    done = noise_scale("--batch-size", "32", "--micro-batch-size", "8")
    assert done.returncode == 0, done.stderr
    labels = [line.split("  ")[0] for line in done.stdout.splitlines()]
    assert labels == ["B_simple", "90% interval", "steps", "batch sizes", "|G|^2", "tr(Sigma)", "meaning"]
    assert "steps             3 (training)" in done.stdout
    assert "batch sizes       32 against 8" in done.stdout
    steps = [line for line in done.stderr.splitlines() if line.startswith("batchfit: noise-scale step ")]
    assert [line.split(":")[1].strip() for line in steps] == [
        "noise-scale step 1/3",
        "noise-scale step 2/3",
        "noise-scale step 3/3",
    ]


def test_json_holds_every_reading(tmp_path: Path) -> None:
    output = tmp_path / "noise.json"
    done = noise_scale(
        "--batch-size", "32", "--accumulation-steps", "2", "--fixed-weights", "--output", str(output)
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "" and f"batchfit: wrote {output}" in done.stderr
    envelope = json.loads(output.read_text())
    (document,) = envelope["results"]
    assert envelope["workload"] == "tiny-from-tests" and document["fixed_weights"] is True
    assert (document["micro_batch_size"], document["accumulation_steps"]) == (16, 2)
    assert len(document["readings"]) == 3 and document["noise_scale"]["steps"] == 3
    assert set(document["noise_scale"]) >= {
        "b_simple",
        "low",
        "high",
        "gradient_norm_sq",
        "trace_sigma",
        "meaning",
    }


def test_a_micro_batch_as_large_as_the_batch_is_one_clean_error() -> None:
    done = noise_scale("--batch-size", "32", "--micro-batch-size", "32")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith(
        "batchfit: error: micro_batch_size (32) equals batch_size (32), so the small batch is the big one"
    )

"""``check`` (and ``batchfit check``): a batch that fits passes with its margin; one past the
boundary fails, by the real trial; the exit code is what CI reads."""

from __future__ import annotations

import json
import subprocess
import sys

from tiny_workloads import build

import batchfit
from batchfit import FitCheck, check, find_batch_size

LIMIT = "3MiB"


def test_the_answer_fits_and_the_next_batch_does_not() -> None:
    workload = build("mlp", "sgd")
    answer = find_batch_size(workload, device="cpu", memory_limit=LIMIT)
    before = [parameter.detach().clone() for parameter in workload.model.parameters()]
    fits = check(workload, answer.batch_size, device="cpu", memory_limit=LIMIT)
    over = check(workload, answer.batch_size + 1, device="cpu", memory_limit=LIMIT)
    assert fits.fits and not over.fits
    assert fits.trial.peak_bytes == answer.peak_bytes and fits.budget_bytes == answer.budget_bytes
    assert fits.margin_bytes == fits.budget_bytes - fits.trial.peak_bytes >= 0
    assert over.trial.batch_size == answer.batch_size + 1 and over.trial.outcome in ("oom", "over_budget")
    after = list(workload.model.parameters())
    assert all(bool((a == b).all()) for a, b in zip(before, after, strict=True))  # left as it was
    assert fits.summary().startswith(f"train: batch_size={answer.batch_size} fits: peak ")
    assert "a margin of" in fits.summary()
    assert over.summary().startswith(f"train: batch_size={answer.batch_size + 1} does not fit a ")
    assert over.summary().endswith("`batchfit find` says what fits now.")
    document = json.loads(over.to_json())
    assert document["fits"] is False and document["margin_bytes"] == over.margin_bytes


def test_an_eval_check_warms_up_at_one_sample() -> None:
    workload = build("mlp", "sgd")
    answer = find_batch_size(workload, "val", device="cpu", memory_limit=LIMIT)
    result = check(workload, answer.batch_size, "val", device="cpu", memory_limit=LIMIT)
    assert isinstance(result, FitCheck) and result.mode == "eval" and result.fits


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "batchfit", "check", "--example", "mlp", "--device", "cpu", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_the_command_exits_0_when_it_fits_and_1_with_the_margin_when_not() -> None:
    workload = batchfit.load_workload("example:mlp", device="cpu")
    answer = find_batch_size(workload, device="cpu", memory_limit="74MiB", memory_fraction=0.5)
    assert answer.stop_reason == "boundary"  # the next batch failed: a real boundary to check around
    flags = ["--memory-limit", "74MiB", "--memory-fraction", "0.5"]
    passed = run_cli("--batch-size", str(answer.batch_size), *flags, "--format", "json")
    assert passed.returncode == 0, passed.stderr
    (result,) = json.loads(passed.stdout)["results"]
    assert result["fits"] and result["margin_bytes"] >= 0 and result["batch_size"] == answer.batch_size
    failed = run_cli("--batch-size", str(answer.batch_size + 1), *flags)
    assert failed.returncode == 1, failed.stderr
    assert f"train: batch_size={answer.batch_size + 1} does not fit a 37.00 MiB budget" in failed.stdout
    assert "Traceback" not in failed.stderr

"""The command line under torchrun, for real: two CPU ranks in a gloo group search in lockstep,
rank 0 alone speaks unless ``--all-ranks``, and an error on one rank ends both (marker
``distributed``). The runs start side by side once per module; the tests read them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from tiny_workloads import as_in_ddp

from batchfit import BatchSizes, find_batch_size
from batchfit.runtime.workloads.examples import build_example

pytestmark = pytest.mark.distributed
TESTS = Path(__file__).resolve().parent
TORCHRUN = (sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2")
#: Two Pythons per run importing torch on 2 cores, three runs side by side; a hang takes longer.
TIMEOUT_SECONDS = 120
MLP = ("--example", "mlp", "--device", "cpu", "--memory-limit", "56MiB")
RUNS: dict[str, tuple[str, ...]] = {
    "find": (*TORCHRUN, "-m", "batchfit", "find", *MLP, "--max-batch-size", "1024", "--modes", "train"),
    "explore": (
        *TORCHRUN,
        "--log-dir",
        "{tmp}/logs",
        "--redirects",
        "1",  # each rank's stdout to its own file
        "-m",
        "batchfit",
        "explore",
        *MLP,
        "--max-batch-size",
        "64",
        "--format",
        "json",
        "--all-ranks",
    ),
    "analyze": (
        *TORCHRUN,
        "-m",
        "batchfit",
        "analyze",
        "--cfg",
        str(TESTS.parents[1] / "examples" / "exp.yaml"),
        "--fractions",
        "0.8",
        "--modes",
        "train",
        "MEMORY_LIMIT",
        "32MiB",
    ),
    "error": (
        *TORCHRUN,
        "-m",
        "batchfit",
        "find",
        "--workload",
        "workloads_for_cli:fails_on_rank_1",
        "--device",
        "cpu",
        "--modes",
        "train",
    ),
}


@dataclass(frozen=True)
class Finished:
    returncode: int
    stdout: str
    stderr: str
    seconds: float
    tmp: Path


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Finished]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(TESTS)}
    started, tmps, processes = time.perf_counter(), {}, {}
    for name, args in RUNS.items():
        tmps[name] = tmp_path_factory.mktemp(name)
        command = [arg.replace("{tmp}", str(tmps[name])) for arg in args]
        processes[name] = subprocess.Popen(
            command, cwd=TESTS, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
    finished = {}
    for name, process in processes.items():
        try:
            stdout, stderr = process.communicate(
                timeout=max(1.0, started + TIMEOUT_SECONDS - time.perf_counter())
            )
        except subprocess.TimeoutExpired:
            for other in processes.values():
                other.kill()
            pytest.fail(f"torchrun {name} still running after {TIMEOUT_SECONDS} s: the ranks hung")
        finished[name] = Finished(
            process.returncode, stdout, stderr, time.perf_counter() - started, tmps[name]
        )
    return finished


def _lines(stderr: str, prefix: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith(prefix)]


def test_find_under_torchrun_speaks_once_with_the_single_process_answer(runs: dict[str, Finished]) -> None:
    run = runs["find"]
    assert run.returncode == 0, run.stderr
    # Each rank's example comes wrapped in DDP, as data-parallel training runs it: the answer of
    # one process whose MLP holds DDP's buckets beside it (unwrapped it would be 1024).
    alone = find_batch_size(
        as_in_ddp(build_example("mlp", "cpu")),
        device="cpu",
        memory_limit="56MiB",
        sizes=BatchSizes(max_batch_size=1024),
    )
    assert (
        run.stdout
        == f"train_batch_size: {alone.batch_size}\n\n{_lines(run.stderr, 'batchfit: train:')[0][10:]}\n"
    )
    # One rank's voice: one summary, one progress line per trial. The ranks' trials are placed by a
    # trace of the module (one process's buffer beside it is run for real from 2, 4 on): the answer
    # and the next.
    assert len(_lines(run.stderr, "batchfit: train:")) == 1
    progress = _lines(run.stderr, "batchfit: train batch_size=")
    sizes = [int(line.split("=")[1].split()[0]) for line in progress]
    assert sizes == [alone.batch_size, alone.batch_size + 1] == [t.batch_size for t in alone.trials][-2:]
    assert "the smallest of 2 ranks" in run.stderr


def test_explore_under_torchrun_gives_every_rank_the_same_measurements(runs: dict[str, Finished]) -> None:
    run = runs["explore"]
    assert run.returncode == 0, run.stderr
    logs = sorted((run.tmp / "logs").rglob("stdout.log"), key=lambda path: path.parent.name)
    assert [path.parent.name for path in logs] == ["0", "1"]
    results: list[dict[str, Any]] = [json.loads(path.read_text())["results"][0] for path in logs]
    # Each window's throughput is the slower rank's and the clock rank 0's: every number agrees.
    assert results[0]["points"] == results[1]["points"]
    assert results[0]["recommendation"] == results[1]["recommendation"]
    assert results[0]["history"] == results[1]["history"]
    assert results[0]["stop_reason"] == results[1]["stop_reason"]
    sizes = [point["batch_size"] for point in results[0]["points"]]
    assert max(sizes) == results[0]["max_batch_size"] == 64
    assert results[0]["recommendation"]["batch_size"] in sizes


def test_analyze_under_torchrun_prints_one_table_of_the_single_process_answer(
    runs: dict[str, Finished],
) -> None:
    run = runs["analyze"]
    assert run.returncode == 0, run.stderr
    alone = find_batch_size(as_in_ddp(build_example("cnn", "cpu")), device="cpu", memory_limit="32MiB")
    header, row = run.stdout.splitlines()  # one table: rank 0's
    assert header.split() == ["fraction", "mode", "batch_size", "peak", "budget", "trials", "seconds"]
    assert row.split()[:3] == ["0.8", "train", str(alone.batch_size)]
    assert sum("real trials for 1 searches" in line for line in run.stderr.splitlines()) == 1


def test_an_error_on_one_rank_ends_both_with_rank_0_naming_it(runs: dict[str, Finished]) -> None:
    run = runs["error"]
    assert run.returncode != 0
    assert (
        "batchfit: error: rank 1 of 2 raised ValueError: a bug in rank 1's train step; every rank "
        "stopped with it. Fix the error on rank 1 (its own traceback says where)."
    ) in run.stderr
    assert "ValueError: a bug in rank 1's train step" in run.stderr  # rank 1's own traceback
    assert run.stderr.count("batchfit: error:") == 1  # rank 1 does not repeat it
    assert run.seconds < TIMEOUT_SECONDS

"""apply_autobatch: the config's searches at start of training, and the example training script."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tiny_workloads import as_in_ddp

from batchfit import (
    BatchSizes,
    apply_autobatch,
    find_batch_size,
    load_config,
)
from batchfit.analysis.apply_autobatch import workload_from_config
from batchfit.runtime.workloads.examples import build_example

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_CONFIG = ROOT / "examples" / "exp.yaml"
SMALL = ["MEMORY_LIMIT", "32MiB"]


def test_enabled_overwrites_both_sizes_and_logs(caplog: pytest.LogCaptureFixture) -> None:
    cfg = load_config(
        EXAMPLE_CONFIG, [*SMALL, "DATA.AUTOBATCH.ENABLED", "True", "DATA.AUTOBATCH.LOG_LEVEL", "DEBUG"]
    )
    assert cfg.DATA.AUTOBATCH.ENABLED_VAL is True  # follows ENABLED through the interpolation
    with caplog.at_level(logging.DEBUG, logger="batchfit"):
        results = apply_autobatch(cfg, workload_from_config(cfg))
    train = find_batch_size(build_example("cnn", "cpu"), "train", device="cpu", memory_limit="32MiB")
    evaluation = find_batch_size(
        build_example("cnn", "cpu"),
        "eval",
        device="cpu",
        memory_limit="32MiB",
        sizes=BatchSizes(max_batch_size=1024),
    )
    assert (cfg.DATA.BATCH_SIZE, cfg.DATA.BATCH_SIZE_VAL) == (train.batch_size, evaluation.batch_size)
    assert [r.mode for r in results] == ["train", "eval"]
    trial_lines = [r for r in caplog.records if "autobatch train trial" in r.getMessage()]
    assert trial_lines and all(r.levelno == logging.DEBUG for r in trial_lines)  # at LOG_LEVEL
    choice = [r for r in caplog.records if "DATA.BATCH_SIZE 32 ->" in r.getMessage()]
    assert len(choice) == 1 and choice[0].levelno == logging.INFO


def test_disabled_leaves_the_config_alone() -> None:
    cfg = load_config(EXAMPLE_CONFIG, SMALL)
    assert apply_autobatch(cfg, workload_from_config(cfg)) == []
    assert (cfg.DATA.BATCH_SIZE, cfg.DATA.BATCH_SIZE_VAL) == (32, 64)


def test_only_the_validation_size() -> None:
    cfg = load_config(
        EXAMPLE_CONFIG,
        [*SMALL, "DATA.AUTOBATCH.ENABLED_VAL", "True", "DATA.AUTOBATCH.TARGET_MEMORY_FRACTION_VAL", "0.5"],
    )
    results = apply_autobatch(cfg, workload_from_config(cfg))
    assert [r.mode for r in results] == ["eval"] and results[0].memory_fraction == 0.5
    assert cfg.DATA.BATCH_SIZE == 32 and cfg.DATA.BATCH_SIZE_VAL == results[0].batch_size


def test_example_training_script_trains_at_the_chosen_sizes() -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "train.py"),
            "--cfg",
            str(EXAMPLE_CONFIG),
            "--steps",
            "3",
            *SMALL,
            "DATA.AUTOBATCH.ENABLED",
            "True",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    train = find_batch_size(build_example("cnn", "cpu"), "train", device="cpu", memory_limit="32MiB")
    assert report["batch_size"] == train.batch_size and report["batch_size_val"] > report["batch_size"]
    assert len(report["train_losses"]) == 3 and report["val_loss"] > 0
    assert "autobatch: DATA.BATCH_SIZE 32 ->" in done.stderr


def test_example_training_script_bad_config_is_one_message(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("DATA:\n  AUTOBATCH:\n    TARGET_MEMORY_FRACTION: 1.5\n")
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "train.py"), "--cfg", str(bad)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith("train: error: DATA.AUTOBATCH.MEMORY_FRACTION (TARGET_MEMORY_FRACTION)")


@pytest.mark.distributed
def test_example_training_script_under_torchrun_trains_every_rank_at_the_agreed_size() -> None:
    # Two CPU ranks in a gloo group: each wraps its model in DDP, the search runs in lockstep, and
    # both train in DDP at the answer of one process whose model holds DDP's buckets beside it;
    # rank 0 alone reports and logs.
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=2",
            str(ROOT / "examples" / "train.py"),
            "--cfg",
            str(EXAMPLE_CONFIG),
            "--steps",
            "2",
            *SMALL,
            "DATA.AUTOBATCH.ENABLED",
            "True",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)  # one line: rank 0's
    alone = build_example("cnn", "cpu")
    train = find_batch_size(as_in_ddp(alone), "train", device="cpu", memory_limit="32MiB")
    plain = find_batch_size(alone, "train", device="cpu", memory_limit="32MiB")
    assert report["sizes_by_rank"] == [[train.batch_size, report["batch_size_val"]]] * 2
    assert train.batch_size < plain.batch_size
    assert len(report["train_losses"]) == 2
    assert done.stderr.count("autobatch: DATA.BATCH_SIZE 32 ->") == 1
    assert "the smallest of 2 ranks" in done.stderr

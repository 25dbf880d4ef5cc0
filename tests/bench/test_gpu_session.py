"""bench/gpu_session.sh, the GPU checks in one call: what it refuses before it spends device time."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "gpu_session.sh"


def session(*stages: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "OUT": str(tmp_path), "PYTHON": sys.executable}
    return subprocess.run(["bash", str(SCRIPT), *stages], capture_output=True, text=True, env=env)


def test_it_names_its_stages_when_given_none_or_a_wrong_one(tmp_path: Path) -> None:
    none = session(tmp_path=tmp_path)
    assert (
        none.returncode == 2
        and "stages: gpu-tests tests find expandable curves explore compare advise" in none.stderr
    )
    wrong = session("find", "curve", tmp_path=tmp_path)
    assert wrong.returncode == 2 and "unknown stage 'curve'" in wrong.stderr
    split = session("curves:cnn", "expandable:cnn", "gpu-tests:cnn", tmp_path=tmp_path)  # tests don't split
    assert split.returncode == 2 and "unknown stage 'gpu-tests:cnn'" in split.stderr
    assert list(tmp_path.iterdir()) == []  # nothing ran


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the stages would run")
def test_without_cuda_it_says_so_and_runs_nothing(tmp_path: Path) -> None:
    done = session("find", tmp_path=tmp_path)
    assert done.returncode == 1 and "torch sees no CUDA device here" in done.stderr
    assert list(tmp_path.iterdir()) == []

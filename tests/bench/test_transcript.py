"""bench/transcript.py records the device the command ran on: the command's own ``--device`` where
the transcript is not told one (the H200's smoke recorded ``cpu`` for a command on ``cuda:0``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import transcript

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("command", "device"),
    [
        (["python3", "-m", "batchfit", "find", "--example", "transformer", "--device", "cuda:0"], "cuda:0"),
        (["python3", "-m", "batchfit", "find", "--device=cuda", "--example", "mlp"], "cuda"),
        (["python3", "examples/find_in_python.py"], None),
        (["python3", "-m", "batchfit", "find", "--device"], None),  # no value: the command's own error
    ],
)
def test_the_device_is_the_one_the_command_names(command: list[str], device: str | None) -> None:
    assert transcript.command_device(command) == device


def test_the_recorded_h200_transcript_names_cuda_in_its_command_and_cpu_as_its_device() -> None:
    # What the docs annotate: the file's device is the transcript's default, not the command's.
    data = json.loads(
        (ROOT / "bench/data/h200-2026-11-26-2/transcript-cuda-find-transformer.json").read_text()
    )
    assert (data["device"], transcript.command_device(data["argv"])) == ("cpu", "cuda:0")
    assert "on cuda:0 (capped at 2.00 GiB)" in data["stderr"]


def test_a_transcript_takes_the_command_s_device(tmp_path: Path) -> None:
    # The command's --device reaches the record: one batchfit does not measure is refused before
    # the command runs (a transcript that ignored it would run it and record cpu).
    written = tmp_path / "transcript.json"
    command = [sys.executable, "-c", "print('ran')", "--device", "meta"]
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "transcript.py"), "--json", str(written), "--", *command],
        capture_output=True,
        text=True,
    )
    assert done.returncode != 0 and "device='meta' is not supported" in done.stderr
    assert "ran" not in done.stdout and not written.exists()

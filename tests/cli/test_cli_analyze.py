"""`batchfit analyze` end to end in a subprocess: reports that parse and agree with `batchfit find`."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "examples" / "exp.yaml"


def batchfit(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "batchfit", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
        check=False,
    )


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    folder = tmp_path_factory.mktemp("reports")
    done = {}
    for suffix in ("json", "jsonl", "csv"):
        run = batchfit(
            "analyze",
            "--cfg",
            str(CONFIG),
            "--fractions",
            "0.6,0.8",
            "--modes",
            "train,val",
            "--output",
            str(folder / f"report.{suffix}"),
            "MEMORY_LIMIT",
            "32MiB",
        )
        assert run.returncode == 0, run.stderr
        done[suffix] = run
    find = batchfit(
        "find",
        "--example",
        "cnn",
        "--device",
        "cpu",
        "--memory-limit",
        "32MiB",
        "--memory-fraction",
        "0.8",
        "--format",
        "json",
    )
    assert find.returncode == 0, find.stderr
    return {"folder": folder, "runs": done, "find": json.loads(find.stdout)}


def test_reports_parse_and_agree(reports: dict[str, object]) -> None:
    folder = reports["folder"]
    assert isinstance(folder, Path)
    envelope = json.loads((folder / "report.json").read_text())
    assert envelope["command"] == "analyze"
    (document,) = envelope["results"]
    rows = document["rows"]
    assert [(row["memory_fraction"], row["mode"]) for row in rows] == [
        (0.6, "train"),
        (0.8, "train"),
        (0.6, "eval"),
        (0.8, "eval"),
    ]
    lines = [json.loads(line) for line in (folder / "report.jsonl").read_text().splitlines()]
    timeless = [{key: value for key, value in row.items() if key != "seconds"} for row in rows]
    assert [{key: value for key, value in row.items() if key != "seconds"} for row in lines] == timeless
    with open(folder / "report.csv", newline="") as handle:
        table = list(csv.DictReader(handle))
    assert [int(row["batch_size"]) for row in table] == [row["batch_size"] for row in rows]
    assert [float(row["memory_fraction"]) for row in table] == [row["memory_fraction"] for row in rows]
    # The 0.8 rows are what `batchfit find` answers at 0.8 (eval's bound is twice train's, as in find).
    find = reports["find"]
    assert isinstance(find, dict)
    answers = {result["mode"]: result["batch_size"] for result in find["results"]}
    assert {row["mode"]: row["batch_size"] for row in rows if row["memory_fraction"] == 0.8} == answers
    for row in rows:
        assert row["peak_bytes"] <= row["budget_bytes"] == int(row["memory_fraction"] * 32 * 2**20)


def test_the_count_is_printed(reports: dict[str, object]) -> None:
    runs = reports["runs"]
    assert isinstance(runs, dict)
    last = runs["json"].stderr.splitlines()
    count = [line for line in last if "real trials for 4 searches" in line]
    assert len(count) == 1 and "fake-tensor traces" in count[0]
    assert runs["json"].stdout == ""


BAD = [
    (["--cfg", "missing.yaml"], "batchfit: error: config file 'missing.yaml' does not exist"),
    (
        ["--cfg", "CONFIG", "--fractions", "0.6,1.5"],
        "batchfit: error: --fractions '0.6,1.5': give comma-separated",
    ),
    (
        ["--cfg", "CONFIG", "DATA.AUTOBATCH.TARGET_MEMORY_FRACTION", "1.5"],
        "batchfit: error: DATA.AUTOBATCH.MEMORY_FRACTION (TARGET_MEMORY_FRACTION) must be",
    ),
    (
        ["--cfg", "CONFIG", "DATA.AUTOBATCH.MIN_BATCH_SIZE", "600"],
        "batchfit: error: DATA.AUTOBATCH.MIN_BATCH_SIZE",
    ),
    (["--cfg", "CONFIG", "WORKLOAD", "example:resnet"], "batchfit: error: WORKLOAD"),
    (
        ["--cfg", "CONFIG", "DATA.AUTOBATCH.ENABLE", "True"],
        (
            "batchfit: error: unknown key DATA.AUTOBATCH.ENABLE (value 'True') in the overrides; "
            "did you mean DATA.AUTOBATCH.ENABLED"
        ),
    ),
    (["--cfg", "CONFIG", "--modes", "train,test"], "batchfit: error: --modes 'train,test': use"),
    (["--cfg", "SYNTAX"], "batchfit: error: config file"),
]


@pytest.mark.parametrize(("args", "message"), BAD)
def test_bad_configs_are_one_message(args: list[str], message: str, tmp_path: Path) -> None:
    syntax = tmp_path / "syntax.yaml"
    syntax.write_text("DATA:\n  BATCH_SIZE: [1, 2\n")
    args = [str(CONFIG) if a == "CONFIG" else str(syntax) if a == "SYNTAX" else a for a in args]
    done = batchfit("analyze", *args, cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == "" and "Traceback" not in done.stderr
    assert done.stderr.startswith(message), done.stderr
    if "SYNTAX" in args or str(syntax) in args:
        assert "is not valid YAML at line" in done.stderr

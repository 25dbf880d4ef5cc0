"""bench/gpu_session.sh, the GPU checks in one call: what it refuses before it spends device time, and
the smoke's plan, which must fit the device time a session is lent."""

from __future__ import annotations

import re
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
        and "stages: smoke gpu-tests tests find expandable curves explore compare predict advise"
        in none.stderr
    )
    wrong = session("find", "curve", tmp_path=tmp_path)
    assert wrong.returncode == 2 and "unknown stage 'curve'" in wrong.stderr
    split = session("curves:cnn", "expandable:cnn", "gpu-tests:cnn", tmp_path=tmp_path)  # tests don't split
    assert split.returncode == 2 and "unknown stage 'gpu-tests:cnn'" in split.stderr
    smoke = session("smoke:cnn", tmp_path=tmp_path)  # nor does the smoke
    assert smoke.returncode == 2 and "unknown stage 'smoke:cnn'" in smoke.stderr
    planned = session("--plan", "find", tmp_path=tmp_path)
    assert planned.returncode == 2 and "--plan covers the smoke alone, not 'find'" in planned.stderr
    predicted = session("--plan", "predict:resnet50", tmp_path=tmp_path)  # a stage that splits by workload
    assert (
        predicted.returncode == 2
        and "--plan covers the smoke alone, not 'predict:resnet50'" in predicted.stderr
    )
    assert list(tmp_path.iterdir()) == []  # nothing ran


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the stages would run")
@pytest.mark.parametrize("stage", ["smoke", "find", "predict:cnn"])
def test_without_cuda_it_says_so_and_runs_nothing(stage: str, tmp_path: Path) -> None:
    done = session(stage, tmp_path=tmp_path)
    assert done.returncode == 1 and "torch sees no CUDA device here" in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_the_smoke_runs_the_gpu_tests_the_main_command_and_find_with_the_truth_in_8_minutes(
    tmp_path: Path,
) -> None:
    planned = session("--plan", "smoke", tmp_path=tmp_path)
    assert planned.returncode == 0 and list(tmp_path.iterdir()) == []  # planned, nothing run
    head, *lines = planned.stdout.splitlines()
    assert head == "smoke: at most 480 s"
    parts = {}
    for line in lines:
        name, rest = line.split(" ", 1)
        seconds, command = rest.split(" s: ", 1)
        parts[name] = (int(seconds), command.replace(sys.executable, "python"))
    assert list(parts) == ["gpu-tests", "adapters", "main-command", "find-builtins", "find-resnet50-amp"]
    # Each part under its timeout, and with a minute for the checks before them, 8 minutes in all.
    assert sum(seconds for seconds, _ in parts.values()) + 30 <= 480
    # The tests never run on a GPU first, every test's outcome in the log (-rA) and in a JUnit file.
    gpu_tests = (
        "env BATCHFIT_TEST_DEADLINE=180 BATCHFIT_TEST_FIRST=bench/gpu_never_run.txt python -m pytest "
        f"-p no:cacheprovider -q -rA --junitxml={tmp_path}/smoke-gpu-tests.xml --durations=0 -m gpu "
        "tests/prediction/test_predict.py"
    )
    assert parts["gpu-tests"][1].startswith(gpu_tests)
    # The deadline leaves a test begun before it 40 s to finish (the DDP one alone, with its
    # collection, took 42 s on the H200: gpu-tests-first-failure.log).
    assert parts["gpu-tests"][0] - 180 >= 40
    assert parts["adapters"][1] == (
        "env BATCHFIT_TEST_FIRST=bench/gpu_never_run.txt python -m pytest -p no:cacheprovider -q -rA "
        f"--junitxml={tmp_path}/smoke-adapters.xml -m gpu tests/integrations"
    )
    readme = "python -m batchfit find --example transformer --memory-limit 2GiB --modes train,eval"
    assert parts["main-command"][1].endswith(f"-- {readme} --device cuda:0")
    finds = [parts["find-builtins"][1], parts["find-resnet50-amp"][1]]
    assert all(command.startswith("python bench/find.py --device cuda --no-competitors") for command in finds)
    assert "--workloads cnn,transformer" in finds[0] and "--window 0 --workloads resnet50-amp" in finds[1]
    # Every results file goes under $OUT, which the device tool brings back.
    written = [command.split("--json ")[1].split()[0] for _, command in parts.values() if "--json" in command]
    written += [
        command.split("--junitxml=")[1].split()[0] for _, command in parts.values() if "--junitxml" in command
    ]
    assert len(written) == 5 and all(path.startswith(f"{tmp_path}/") for path in written)


def test_the_smoke_s_gpu_tests_name_every_file_that_has_one_outside_the_adapters(tmp_path: Path) -> None:
    planned = session("--plan", "smoke", tmp_path=tmp_path).stdout
    named = set(planned.split("gpu-tests ", 1)[1].split("\n", 1)[0].split(" -m gpu ", 1)[1].split())
    tests = SCRIPT.parents[1] / "tests"
    marked = {
        str(path.relative_to(SCRIPT.parents[1]))
        for path in tests.rglob("test_*.py")
        if re.search(r"pytest\.mark\.gpu\b", path.read_text()) and "integrations" not in path.parts
    }
    assert named == marked


def test_a_run_under_a_deadline_skips_the_tests_not_begun_by_it_and_says_so(tmp_path: Path) -> None:
    (tmp_path / "test_slow.py").write_text(
        "import time\n\ndef test_a():\n    time.sleep(1.5)\n\ndef test_b():\n    pass\n"
    )
    (tmp_path / "conftest.py").write_text((SCRIPT.parents[1] / "tests" / "conftest.py").read_text())
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(SCRIPT.parents[1] / "tests")}

    def run(deadline: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-v", "-rs", str(tmp_path)]
        return subprocess.run(
            command, capture_output=True, text=True, env={**env, "BATCHFIT_TEST_DEADLINE": deadline}
        )

    late = run("1")
    assert late.returncode == 0 and "1 passed, 1 skipped" in late.stdout
    assert "test_slow.py::test_a PASSED" in late.stdout and "test_slow.py::test_b SKIPPED" in late.stdout
    assert "BATCHFIT_TEST_DEADLINE=1: the run's 1 s were spent before this test began" in late.stdout
    assert "2 passed" in run("60").stdout
    wrong = run("soon")
    assert wrong.returncode == 4 and "BATCHFIT_TEST_DEADLINE='soon': give the run's seconds" in wrong.stderr


def test_the_listed_tests_run_first_and_a_skipped_one_is_counted_as_skipped(tmp_path: Path) -> None:
    (tmp_path / "test_order.py").write_text(
        "import pytest\n\ndef test_a():\n    pass\n\ndef test_b():\n    pytest.skip('no GPU')\n\n"
        "def test_c():\n    pass\n\ndef test_d():\n    assert False\n"
    )
    (tmp_path / "conftest.py").write_text((SCRIPT.parents[1] / "tests" / "conftest.py").read_text())
    (tmp_path / "first.txt").write_text("# never run\ntest_order.py::test_d\ntest_order.py::test_c\n")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(SCRIPT.parents[1] / "tests")}
    report = tmp_path / "report.xml"
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rA", f"--junitxml={report}"]
    done = subprocess.run(
        [*command, "test_order.py"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**env, "BATCHFIT_TEST_FIRST": str(tmp_path / "first.txt")},
    )
    assert done.stdout.splitlines()[0].startswith("F..s")  # d, c, then a and b in their order
    assert (
        "SKIPPED [1] test_order.py:7: no GPU" in done.stdout and "PASSED test_order.py::test_c" in done.stdout
    )
    counted = subprocess.run(
        [sys.executable, str(SCRIPT.parent / "junit_outcomes.py"), str(report)],
        capture_output=True,
        text=True,
    )
    assert counted.returncode == 1
    assert counted.stdout.splitlines() == [
        "2 passed, 1 failed, 0 errors, 1 skipped (not run: not passed), of 4",
        "FAILED test_order::test_d",
        "PASSED test_order::test_c",
        "PASSED test_order::test_a",
        "SKIPPED test_order::test_b",
    ]
    missing = subprocess.run(
        [sys.executable, str(SCRIPT.parent / "junit_outcomes.py"), str(tmp_path / "none.xml")],
        capture_output=True,
        text=True,
    )
    assert missing.returncode == 2 and "a run stopped before pytest wrote its report" in missing.stderr
    wrong = subprocess.run(
        [*command, "test_order.py"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**env, "BATCHFIT_TEST_FIRST": "gone.txt"},
    )
    assert wrong.returncode == 4 and "BATCHFIT_TEST_FIRST='gone.txt': no such file" in wrong.stderr

"""Which gpu tests have passed on a GPU, read from the GPU sessions' recorded pytest logs, and which
never have: ``bench/gpu_never_run.txt``, the list the smoke runs first (``BATCHFIT_TEST_FIRST``).

``pytest -q`` prints one character a test (``.`` passed, ``F`` failed, ``E`` an error, ``s``
skipped), in the order the tests ran, which is the order pytest collected them. Their names come
from collecting the same command's tests at the commit the session ran (``git archive`` of it), and
the count is checked against the log's own summary where it has one. Lines of ``-rA``
(``PASSED tests/...::name``) and ``FAILED`` lines name tests directly. A test counts as run on a GPU
where a log shows it passed under the same node id; a test added or renamed since has not.

Run (CPU only, about a minute): ``python bench/gpu_tests_run.py [--json F]``; it rewrites the list.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import _harness

DEFAULT_JSON = "bench/data/cpu-2026-11-28/gpu-tests-run.json"
NEVER_RUN = _harness.ROOT / "bench" / "gpu_never_run.txt"
#: What a progress character says of its test.
OUTCOMES = {".": "passed", "F": "failed", "E": "error", "s": "skipped", "x": "xfailed", "X": "xpassed"}


@dataclass(frozen=True)
class Log:
    """A recorded pytest log: the commit its session ran, and the arguments that chose its tests."""

    path: str
    commit: str | None  # None: the log names its tests itself (FAILED/PASSED lines)
    arguments: tuple[str, ...]
    source: str  # where the commit and the command are written down


#: The GPU sessions' pytest logs (docs/benchmarks.md's session notes, and each session's own log).
LOGS = (
    Log(
        "bench/data/h200-2026-11-26/gpu-tests.log",
        "cccf28b",
        ("-m", "gpu"),
        "bench/tables.py NOTES (the session's commit); bench/gpu_session.sh's gpu-tests stage at cccf28b",
    ),
    Log(
        "bench/data/h200-2026-11-26-2/smoke-gpu-tests.log",
        "7600efc",
        ("-m", "gpu", "--ignore=tests/integrations"),
        "bench/data/h200-2026-11-26-2/smoke-session.log (its command; find's results file there: 7600efc)",
    ),
    Log(
        "bench/data/h200-2026-11-26-2/smoke-adapters.log",
        "7600efc",
        ("-m", "gpu", "tests/integrations"),
        "bench/data/h200-2026-11-26-2/smoke-session.log",
    ),
    Log("bench/data/h200-2026-11-26-2/gpu-tests-first-failure.log", None, (), "its FAILED line"),
)


def progress(text: str) -> str:
    """The outcome characters at the head of a ``pytest -q`` log (before its first section)."""
    head = re.match(r"[.FEsxX\s]*?(?=\s*(\[\s*\d+%\]|=|_|$))", text)
    line = head.group(0) if head else ""
    return "".join(char for char in line if char in OUTCOMES)


def named(text: str) -> dict[str, str]:
    """The outcomes a log names: ``PASSED id``, ``FAILED id`` (``-rA``, ``-rf``), ``SKIPPED``."""
    found = {}
    for word, node in re.findall(
        r"^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) (tests/\S+)", text, re.MULTILINE
    ):
        found[node] = {"PASSED": "passed", "FAILED": "failed", "ERROR": "error"}.get(word, word.lower())
    return found


def summary_count(text: str) -> int | None:
    """The tests a log's final summary counts (passed, failed, errors, skipped), or None (cut short)."""
    line = re.search(r"^=*\s*(\d+ (passed|failed)[^\n]*) in [\d.]+s", text, re.MULTILINE)
    if line is None:
        return None
    counted = re.findall(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed)", line.group(1))
    return sum(int(count) for count, _ in counted)


def outcomes(text: str, collected: list[str]) -> dict[str, str]:
    """Each test's outcome: the progress characters in collection order (where the collection is
    known), then what the log names."""
    chars = progress(text) if collected else ""
    if len(chars) > len(collected):
        raise ValueError(f"{len(chars)} outcomes but {len(collected)} tests collected: not the same run")
    return {node: OUTCOMES[char] for node, char in zip(collected, chars, strict=False)} | named(text)


def collect(root: Path, arguments: tuple[str, ...]) -> list[str]:
    """The node ids ``pytest --collect-only`` gives in ``root`` for ``arguments``, in order."""
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q", *arguments]
    done = subprocess.run(command, cwd=root, capture_output=True, text=True, env=_environment(root))
    nodes = [line for line in done.stdout.splitlines() if line.startswith("tests/") and "::" in line]
    if done.returncode != 0 or not nodes:
        raise RuntimeError(
            f"collecting {arguments} in {root} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
        )
    return nodes


def _environment(root: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(root / "src")}


def collect_at(commit: str, arguments: tuple[str, ...]) -> list[str]:
    """The collection at ``commit``: its tree from ``git archive``, collected in a scratch directory."""
    with tempfile.TemporaryDirectory() as scratch:
        archive = subprocess.run(
            ["git", "-C", str(_harness.ROOT), "archive", commit], capture_output=True, check=True
        )
        subprocess.run(["tar", "-x", "-C", scratch], input=archive.stdout, check=True)
        return collect(Path(scratch), arguments)


def read_log(log: Log) -> dict[str, Any]:
    text = (_harness.ROOT / log.path).read_text()
    collected = collect_at(log.commit, log.arguments) if log.commit else []
    found = outcomes(text, collected)
    counted = summary_count(text)
    if collected and counted is not None and counted != len(collected):
        raise ValueError(
            f"{log.path}: its summary counts {counted} tests, the collection at {log.commit} {len(collected)}"
        )
    tally = {outcome: list(found.values()).count(outcome) for outcome in sorted(set(found.values()))}
    return {
        "log": log.path,
        "commit": log.commit,
        "arguments": list(log.arguments),
        "source": log.source,
        "progress": progress(text),
        "summary_count": counted,
        "collected": collected,
        "outcomes": found,
        "tally": tally,
    }


#: Test files moved since a log was taken (the rooms by concept), old path -> new: a test that passed
#: under its old node id has passed.
MOVED = {
    "tests/test_predict.py": "tests/prediction/test_predict.py",
    "tests/test_check_data.py": "tests/data_check/test_check_data.py",
}


def moved(node: str) -> str:
    """``node`` under its file's path now."""
    path, _, test = node.partition("::")
    return f"{MOVED.get(path, path)}::{test}"


def never_run(logs: list[dict[str, Any]], now: list[str]) -> list[str]:
    """The gpu tests collected now that no log shows passed (under their path now), in collection
    order."""
    passed = {moved(node) for log in logs for node, outcome in log["outcomes"].items() if outcome == "passed"}
    return [node for node in now if node not in passed]


def write_list(nodes: list[str]) -> None:
    header = (
        "# The gpu tests no GPU session's log shows passed (bench/gpu_tests_run.py writes this list from\n"
        "# bench/data/h200-*/ logs; bench/data/cpu-2026-11-28/gpu-tests-run.json holds the reading).\n"
        "# The smoke runs them first (BATCHFIT_TEST_FIRST, tests/conftest.py). One node id a line.\n"
    )
    NEVER_RUN.write_text(header + "".join(f"{node}\n" for node in nodes))


def main(argv: list[str] | None = None) -> int:
    args, session = _harness.start(
        __doc__, argv, quick="(not used)", json_default=DEFAULT_JSON, packages=["torch", "batchfit", "pytest"]
    )
    logs = [read_log(log) for log in LOGS]
    for log in logs:
        print(f"{log['log']} at {log['commit']}: {len(log['collected'])} collected, {log['tally']}")
    now = collect(_harness.ROOT, ("-m", "gpu"))
    missing = never_run(logs, now)
    print(f"gpu tests now: {len(now)}; never passed on a GPU: {len(missing)}")
    write_list(missing)
    payload = {"logs": logs, "gpu_tests_now": now, "never_run": missing}
    _harness.save(args, session, _harness.ROOT / DEFAULT_JSON, payload)
    return 0


if __name__ == "__main__":
    sys.exit(main())

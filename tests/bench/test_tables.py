"""The figures of README.md and docs/ come from committed results files (bench/tables.py): every
table, transcript and summary line between markers is what its files give, each file says what code,
device, torch and command made it, and every bench writes such a file."""

from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path

import pytest
import torch

# bench/ is a directory of scripts, not a package: its directory goes on the path.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import _harness
import _tables_base
import tables

BENCH = Path(__file__).resolve().parents[2] / "bench"
ROOT = BENCH.parent
H200_FIND = "bench/data/h200-2026-11-26/find-cuda-resnet50-amp-resnet50-mlp-cnn-transformer.json"
H100_BUILT_INS = "bench/data/h100-2026-11-25/find-cuda-mlp-cnn-transformer.json"


def blocks() -> list[tuple[Path, str]]:
    return [
        (path, match["spec"])
        for path in tables.documents()
        for match in tables.BLOCK.finditer(path.read_text())
    ]


def test_every_table_in_the_readme_and_docs_is_what_its_files_give() -> None:
    assert len(blocks()) >= 5
    assert tables.stale(tables.documents()) == [], "run: python bench/tables.py"


def test_a_figure_edited_by_hand_is_caught(tmp_path: Path) -> None:
    spec = f"find {H200_FIND}"
    made = f"<!-- table: {spec} -->{tables.render(spec)}<!-- /table -->"
    page = tmp_path / "page.md"
    page.write_text(f"# A page\n\n{made}\n")
    assert tables.stale([page]) == []
    page.write_text(f"# A page\n\n{made.replace('| 241, truth 242 |', '| 242 exact |')}\n")
    assert tables.stale([page]) == [f"{page}: {spec}"]
    assert tables.regenerate(page.read_text()) == f"# A page\n\n{made}\n"


def test_the_mlp_row_says_that_lightning_s_671_trained_past_the_old_truth_s_ceiling() -> None:
    # The README's GPU table said "Lightning 671, fails 20 steps"; its file says it trained.
    row = next(
        row
        for row in json.loads((ROOT / H100_BUILT_INS).read_text())["rows"]
        if row["case"]["workload"] == "mlp"
    )
    assert (
        row["competitors"]["lightning"]["answer"] == 671 and row["competitors"]["lightning"]["trains"] is True
    )
    table = tables.render(f"find {H100_BUILT_INS}")
    assert "| 671, above the truth's ceiling (512), trains 20 steps |" in table


def test_files_that_record_no_commit_take_it_from_the_session_notes_not_from_a_new_field() -> None:
    data = json.loads((ROOT / H200_FIND).read_text())
    assert data["versions"]["batchfit"] is None and "code" not in data and "commit" not in json.dumps(data)
    said = _tables_base.provenance({**data, "path": H200_FIND})
    assert "at `cccf28b` (from the session notes; the file records no commit (`batchfit: null`))" in said
    assert "NVIDIA H200" in said and "torch 2.11.0" in said


@pytest.mark.parametrize(
    "path", sorted(str(p.relative_to(ROOT)) for p in (ROOT / "bench/data").rglob("*.json"))
)
def test_every_committed_results_file_says_what_made_it(path: str) -> None:
    said = _tables_base.provenance(_tables_base.load(path))
    assert re.search(r"at (`[0-9a-f]{7}`|batchfit )", said) and " torch " in said and "`: `" in said


def test_every_file_a_table_names_is_committed_and_every_json_one_is_named() -> None:
    named = {path for _, spec in blocks() for path in spec.split()[1:]}
    assert all((ROOT / path).is_file() for path in named)
    committed = {str(path.relative_to(ROOT)) for path in (ROOT / "bench/data").rglob("*.json")}
    assert committed - named == set(), "a results file no table shows"


def test_a_results_file_written_now_records_the_commit_device_torch_and_command(tmp_path: Path) -> None:
    session = _harness.Session(torch.device("cpu"), ["torch", "batchfit"])
    session.finish()
    _harness.write_results(tmp_path / "run.json", session, {"rows": []})
    data = json.loads((tmp_path / "run.json").read_text())
    if (ROOT / ".git").exists():  # a checkout (a worktree's .git is a file)
        assert data["code"]["source"] == "git" and re.fullmatch(r"[0-9a-f]{40}", data["code"]["commit"])
    else:
        assert data["code"]["source"] in (_harness.COMMIT_VARIABLE, "version")
    assert data["torch"] == torch.__version__ and data["device"] == "cpu" and "threads" in data["device_name"]
    assert data["command"].startswith("python ") and data["rows"] == []
    assert _tables_base.provenance({**data, "path": "run.json"}).startswith("`run.json`: `python ")


def test_every_bench_that_writes_results_writes_them_through_the_harness() -> None:
    # write_results takes the Session, whose record (commit, device, torch, command) it adds: a
    # bench that wrote its own file would leave that out. Only data_parallel's ranks write files of
    # their own, which its main process gathers into its results file; tables.py writes the docs;
    # gpu_tests_run.py writes the smoke's list (bench/gpu_never_run.txt) beside its results file.
    for script in sorted(BENCH.glob("*.py")):
        if script.name in ("_harness.py", "tables.py"):
            continue
        for node in ast.walk(ast.parse(script.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                own = script.name in ("data_parallel.py", "gpu_tests_run.py")
                writes = node.func.attr in ("write_text", "dump") and not own
                assert not writes, f"{script.name}:{node.lineno} writes a file outside _harness.write_results"


def test_every_link_into_the_docs_finds_its_heading() -> None:
    headings = {
        path.name: {anchor(line) for line in path.read_text().splitlines() if line.startswith("#")}
        for path in (ROOT / "docs").glob("*.md")
    }
    for path in tables.documents():
        for page, fragment in re.findall(r"\]\((?:docs/)?([a-z-]+\.md)#([^)]+)\)", path.read_text()):
            assert fragment in headings[page], (
                f"{path.name} links to {page}#{fragment}, which has no such heading"
            )


def anchor(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    text = heading.lstrip("#").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")

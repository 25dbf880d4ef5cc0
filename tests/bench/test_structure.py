"""bench/structure.py measures src and bench against the house style's limits: an ``__init__`` counts
like any function, and bench/ holds none over them (src's own are reported, not asserted here)."""

from __future__ import annotations

import sys
from pathlib import Path

# bench/ is a directory of scripts, not a package: its directory goes on the path.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import structure

ROOT = Path(__file__).resolve().parents[2]

WIDE = """
class Step:
    def __init__(self, a, b, c, d, e, f, g, h, *, i, j, k):
        self.a = a

    def run(self, batch):
        def inner(x):
            return x
        return inner(batch)


def helper(a, b, /, c, *rest, **more):
    return a
"""


def test_every_function_counts_its_parameters_and_init_is_one_of_them(tmp_path: Path) -> None:
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "wide.py").write_text(WIDE)
    (tmp_path / "bench" / "data").mkdir()
    (tmp_path / "bench" / "data" / "left_out.py").write_text("def recorded(): pass\n")
    shape = structure.measure(tmp_path, "bench")
    assert sorted(shape.signatures) == [
        (1, "wide.py:Step.run"),
        (1, "wide.py:Step.run.inner"),
        (5, "wide.py:helper"),
        (11, "wide.py:Step.__init__"),
    ]
    assert shape.modules == [(len(WIDE.splitlines()), "wide.py")]
    assert shape.over()["signatures over 8 parameters"] == [(11, "wide.py:Step.__init__")]
    said = structure.report("bench", shape)
    assert "  signatures over 8 parameters: 1\n      11  wide.py:Step.__init__\n" in said
    assert said.endswith("  widest signature: 11  wide.py:Step.__init__")


def test_bench_is_within_the_house_limits() -> None:
    over = structure.measure(ROOT, "bench").over()
    assert over == {what: [] for what in over}, structure.report("bench", structure.measure(ROOT, "bench"))


def test_src_is_measured_with_its_init_signatures() -> None:
    # src's own debts are other work's to pay; here only that they are measured, __init__ included.
    shape = structure.measure(ROOT, "src")
    assert any(where.endswith(".__init__") for _, where in shape.signatures)
    assert len(shape.modules) > 100 and all(size > 0 for size, _ in shape.functions)

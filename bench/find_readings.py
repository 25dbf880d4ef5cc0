"""The GPU's recorded find rows read strictly (``_readings``): for every row of the committed H200 and
H100 results files of ``bench/find.py``, each method's answer read three ways on the row's own truth
(the largest fitting size probed up to its bound; no failure probed below it; trains 20 steps),
beside the weak verdict the tables called exact. Computed from those files alone: a reading the
file lacks what it needs for is None, "not measured".

Run (CPU only, under a second): ``python bench/find_readings.py [--json F]``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import _harness
import _tables_base
import _tables_find
from _readings import read_row
from _truth import WINDOW

#: The recorded files this reads: every ``find-*.json`` of a GPU session that holds find rows.
PATTERNS = ("bench/data/h200-*/find-*.json", "bench/data/h100-*/find-*.json")
DEFAULT_JSON = "bench/data/cpu-2026-11-28/find-readings.json"


def recorded_files() -> list[str]:
    return sorted(str(path.relative_to(_harness.ROOT)) for p in PATTERNS for path in _harness.ROOT.glob(p))


def weak_exact(row: dict[str, Any], method: str) -> bool:
    """The weak verdict the tables print: ``N exact``."""
    return _tables_find._verdict_cell(row, method).endswith(" exact")


def read_file(path: str) -> tuple[list[dict[str, Any]], str | None]:
    """The file's rows read, or why it has none to read."""
    data = _tables_base.load(path)
    if "rows" not in data:
        return [], "no find rows (a recording of trials near the boundaries, not an answer judged)"
    bounds = data.get("bounds") or _tables_find.FIND_BOUNDS
    window = data.get("truth", {}).get("window", WINDOW) if data.get("truth") else 0.0
    rows = []
    for row in data["rows"]:
        methods = {}
        for method in ("batchfit", "lightning", "accelerate"):
            readings = read_row(row, method, bounds.get(method), window)
            if readings is not None:
                methods[method] = readings.to_dict() | {"weak_exact": weak_exact(row, method)}
        rows.append(
            {
                "file": path,
                "workload": _tables_find._name(row),
                "cap": _tables_find._cap(row),
                "truth_kind": "scan" if "fits" in row["truth"] else "bisection",
                "truth": _tables_find._truth_cell(row, window if "fits" in row["truth"] else None),
                "trials": len(row["batchfit"]["sizes"]),
                "methods": methods,
            }
        )
    return rows, None


def summary(rows: list[dict[str, Any]], method: str = "batchfit") -> dict[str, Any]:
    """Per reading, how many rows read yes, no and not measured; the rows the weak verdict calls
    exact that a strict reading does not read yes."""
    read = [row for row in rows if method in row["methods"]]
    counts = {}
    for name in ("largest", "none_below_fails", "trains", "strict"):
        values = [row["methods"][method][name] for row in read]
        counts[name] = {
            "yes": values.count(True),
            "no": values.count(False),
            "not_measured": values.count(None),
        }
    differ = [
        f"{row['workload']} at {row['cap']} ({row['file']})"
        for row in read
        if row["methods"][method]["weak_exact"] and row["methods"][method]["strict"] is not True
    ]
    weak = sum(row["methods"][method]["weak_exact"] for row in read)
    return {"rows": len(read), "counts": counts, "weak_exact": weak, "weak_exact_not_strict": differ}


def main(argv: list[str] | None = None) -> int:
    args, session = _harness.start(__doc__, argv, quick="(not used)", json_default=DEFAULT_JSON)
    rows: list[dict[str, Any]] = []
    skipped: dict[str, str] = {}
    for path in recorded_files():
        found, why = read_file(path)
        rows += found
        if why is not None:
            skipped[path] = why
    for row in rows:
        ours = row["methods"]["batchfit"]
        print(
            f"{row['workload']:<28} {row['cap']:<18} {ours['answer']:>4}  largest {ours['largest']!s:<5} "
            f"none below fails {ours['none_below_fails']!s:<5} trains {ours['trains']!s:<5} "
            f"weak exact {ours['weak_exact']!s:<5} {Path(row['file']).name}"
        )
    by_file = {
        path: summary([r for r in rows if r["file"] == path])
        for path in dict.fromkeys(r["file"] for r in rows)
    }
    payload = {"files": recorded_files(), "skipped": skipped, "rows": rows, "summary": by_file}
    _harness.save(args, session, _harness.ROOT / DEFAULT_JSON, payload)
    return 0


if __name__ == "__main__":
    sys.exit(main())

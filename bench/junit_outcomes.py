"""Every test's outcome in a pytest JUnit XML file (``--junitxml``): the counts of passed, failed,
errors and skipped (a skipped test has not run: it is not a pass), then each test's name and outcome.
Exit 0 when every test passed, 1 when one failed, raised an error or was skipped, 2 when the file is
missing or not JUnit XML (a run killed before pytest wrote it).

    python bench/junit_outcomes.py FILE.xml
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ElementTree
from collections import Counter
from pathlib import Path


def outcomes(path: Path) -> list[tuple[str, str]]:
    """Each test case's ``classname::name`` and its outcome, in the file's order."""
    found = []
    for case in ElementTree.parse(path).getroot().iter("testcase"):
        kinds = {child.tag for child in case}
        outcome = next((kind for kind in ("failure", "error", "skipped") if kind in kinds), "passed")
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        found.append((name, {"failure": "failed"}.get(outcome, outcome)))
    return found


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python bench/junit_outcomes.py FILE.xml", file=sys.stderr)
        return 2
    try:
        found = outcomes(Path(args[0]))
    except (OSError, ElementTree.ParseError) as error:
        print(
            f"junit_outcomes: {args[0]}: {error} (a run stopped before pytest wrote its report)",
            file=sys.stderr,
        )
        return 2
    counts = Counter(outcome for _, outcome in found)
    print(
        f"{counts['passed']} passed, {counts['failed']} failed, {counts['error']} errors, "
        f"{counts['skipped']} skipped (not run: not passed), of {len(found)}"
    )
    for name, outcome in found:
        print(f"{outcome.upper()} {name}")
    return 0 if counts["passed"] == len(found) else 1


if __name__ == "__main__":
    sys.exit(main())

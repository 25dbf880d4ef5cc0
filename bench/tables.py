"""The tables, transcripts and summary lines of README.md and docs/, made from committed results files.

Each one sits between two marker comments that say what makes it:

    <!-- table: KIND FILE [FILE ...] -->
    ...what this script writes...
    <!-- /table -->

KIND is one of ``RENDERERS``; the files are paths from the repository's root. ``python
bench/tables.py`` rewrites every such block from its files; ``--check`` only says which differ
(``tests/bench/test_tables.py`` runs it). Files written before the harness recorded the commit,
the device's name and the command get those from ``NOTES`` (``_tables_base``), what the session
notes said. The renderers live by what they render: ``_tables_find``, ``_tables_training``,
``_tables_predict``, ``_tables_allocator`` and ``_tables_sessions``.
"""

from __future__ import annotations

import argparse
import functools
import re
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from _tables_allocator import (
    allocator_history_table,
    expandable_agreement_table,
    predict_histories_table,
    transient_requests_table,
)
from _tables_base import ROOT, load
from _tables_find import (
    curves_table,
    find_readings_summary,
    find_readings_table,
    find_summary,
    find_table,
    forecast_trained_table,
    trials_replay_table,
)
from _tables_predict import predict_table, predict_trace_table, standin_agreement_table
from _tables_sessions import gpu_tests_run_table, source_block, timings_table, transcript_block
from _tables_training import (
    batch_schedule_table,
    bf16_kernels_table,
    compare_table,
    explore_replay_table,
    explore_table,
    noise_prediction_table,
    verb_minutes_table,
)

DOCUMENTS = ("README.md", "docs/*.md")
BLOCK = re.compile(
    r"(<!-- table: (?P<spec>[a-z][a-z0-9-]* [^>]*?) -->)(?P<body>.*?)(<!-- /table -->)", re.DOTALL
)


#: KIND -> (renderer, whether it takes results files (else paths), whether it renders inline).
RENDERERS: dict[str, tuple[Callable[[Any], str], bool, bool]] = {
    "find": (find_table, True, False),
    "find-summary": (find_summary, True, True),
    "find-readings": (find_readings_table, True, False),
    "find-readings-summary": (find_readings_summary, True, True),
    "curves": (curves_table, True, False),
    "compare": (compare_table, True, False),
    "explore": (explore_table, True, False),
    "explore-replay": (explore_replay_table, True, False),
    "timings": (timings_table, True, False),
    "forecast-trained": (forecast_trained_table, True, False),
    "batch-schedule": (batch_schedule_table, True, False),
    "noise-prediction": (noise_prediction_table, True, False),
    "bf16-kernels": (bf16_kernels_table, True, False),
    "verb-minutes": (verb_minutes_table, True, False),
    "predict": (predict_table, True, False),
    "allocator-history": (allocator_history_table, True, False),
    "predict-histories": (predict_histories_table, True, False),
    "predict-trace": (predict_trace_table, True, False),
    "standin-agreement": (standin_agreement_table, True, False),
    "trials-replay": (trials_replay_table, True, False),
    "gpu-tests-run": (gpu_tests_run_table, True, False),
    "transient-requests": (transient_requests_table, True, False),
    "expandable-agreement": (expandable_agreement_table, True, False),
    "transcript": (transcript_block, True, False),
    "transcript-short": (functools.partial(transcript_block, short=True), True, False),
    "source": (source_block, False, False),
}


def render(spec: str) -> str:
    """The text a block of ``spec`` (``KIND FILE [FILE ...]``) holds, newlines around a block's."""
    kind, *paths = spec.split()
    if kind not in RENDERERS or not paths:
        kinds = ", ".join(RENDERERS)
        raise ValueError(f"a table is 'KIND FILE [FILE ...]' with KIND one of {kinds}: {spec!r}")
    renderer, reads, inline = RENDERERS[kind]
    text = renderer([load(path) for path in paths] if reads else paths)
    return text if inline else f"\n{text}\n"


def shown(path: Path) -> Path:
    """``path`` from the repository's root where it lies in it."""
    return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path


def documents() -> list[Path]:
    return [path for pattern in DOCUMENTS for path in sorted(ROOT.glob(pattern))]


def regenerate(text: str) -> str:
    return BLOCK.sub(lambda match: match[1] + render(match["spec"]) + match[4], text)


def stale(paths: Iterable[Path]) -> list[str]:
    """The blocks whose text differs from what their files give, as ``document: spec``."""
    found = []
    for path in paths:
        for match in BLOCK.finditer(path.read_text()):
            if match["body"] != render(match["spec"]):
                found.append(f"{shown(path)}: {match['spec']}")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only say which blocks differ (exit 1 if any)")
    args = parser.parse_args(argv)
    if args.check:
        found = stale(documents())
        for block in found:
            print(f"stale: {block}")
        return 1 if found else 0
    for path in documents():
        text = path.read_text()
        if (new := regenerate(text)) != text:
            path.write_text(new)
            print(f"rewrote {shown(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

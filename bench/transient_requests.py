"""The requests in CUDA's recorded allocator histories that are freed before the next request is
made (a kernel's workspace: cuDNN's convolutions take theirs so), per trial: how many, the largest,
and their bytes in all, each one at a time. Read from ``bench/allocator_history.py``'s files alone
(trace entries without stack frames, so they do not say which library asked).

Run (CPU only, under a second): ``python bench/transient_requests.py [--json F]``.
"""

from __future__ import annotations

import itertools
import json
import sys
from typing import Any

import _harness

DEFAULT_JSON = "bench/data/cpu-2026-11-28/transient-requests.json"
HISTORIES = ("resnet50", "resnet50-amp", "cnn")


def transient(entries: list[str]) -> list[int]:
    """The sizes of the ``alloc`` entries whose next request (``alloc`` or ``free_requested``) frees them."""
    parsed = [entry.split() for entry in entries]
    requests = [
        (action, address, int(size))
        for action, address, size, *_ in parsed
        if action in ("alloc", "free_requested")
    ]
    return [
        size
        for (action, address, size), (after, freed, _) in itertools.pairwise(requests)
        if action == "alloc" and after == "free_requested" and freed == address
    ]


def rows() -> list[dict[str, Any]]:
    found = []
    for workload in HISTORIES:
        path = f"bench/data/h200-2026-11-26-2/allocator-history-cuda-{workload}.json"
        data = json.loads((_harness.ROOT / path).read_text())
        for trial in data["trials"]:
            sizes = transient(trial["entries"])
            found.append(
                {
                    "file": path,
                    "workload": workload,
                    "batch_size": trial["batch_size"],
                    "steps": trial["steps"],
                    "dropped": trial["dropped"],
                    "requests": sum(entry.startswith("alloc ") for entry in trial["entries"]),
                    "transient": len(sizes),
                    "transient_not_a_multiple_of_512": sum(size % 512 != 0 for size in sizes),
                    "largest_bytes": max(sizes, default=0),
                    "total_bytes": sum(sizes),
                }
            )
    return found


def main(argv: list[str] | None = None) -> int:
    args, session = _harness.start(__doc__, argv, quick="(not used)", json_default=DEFAULT_JSON)
    found = rows()
    for row in found:
        largest, total = row["largest_bytes"] / 2**20, row["total_bytes"] / 2**20
        print(
            f"{row['workload']:<13} {row['batch_size']:>2}: {row['transient']} of {row['requests']} requests "
            f"freed before the next, largest {largest:.1f} MiB, {total:.0f} MiB in all"
        )
    _harness.save(args, session, _harness.ROOT / DEFAULT_JSON, {"rows": found})
    return 0


if __name__ == "__main__":
    sys.exit(main())

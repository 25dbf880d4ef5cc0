"""The cost of a lockstep search: ``batchfit find`` on 2 ranks (torchrun) against 1, same caps.

    .venv/bin/python bench/lockstep.py            # CPU: two gloo ranks, each a capped CPU device
    .venv/bin/python bench/lockstep.py --quick    # the mlp alone

Each run is the real command line, ``--format json``, one thread per process; the seconds
compared are the search's own (``search_seconds`` of rank 0), not the start of the processes.
The ranks share this machine's cores, so on the CPU the ratio includes their contention: it is an
upper bound on what the collectives themselves cost.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import torch
from _harness import RESULTS, Session, parser, print_text_table, ratio, save

#: (example, memory limit, max batch size): a boundary inside the range for each.
CASES = (("mlp", "48MiB", 1024), ("cnn", "256MiB", 512), ("transformer", "1GiB", 512))
TIMEOUT_SECONDS = 600


def find(example: str, limit: str, max_batch_size: int, ranks: int) -> dict[str, Any]:
    """``batchfit find`` on ``ranks`` processes; rank 0's train result."""
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}"]
    command = [
        *(launcher if ranks > 1 else [sys.executable]),
        "-m",
        "batchfit",
        "find",
        "--example",
        example,
        "--device",
        "cpu",
        "--memory-limit",
        limit,
        "--max-batch-size",
        str(max_batch_size),
        "--modes",
        "train",
        "--format",
        "json",
    ]
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_SECONDS,
        check=False,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr}")
    result: dict[str, Any] = json.loads(done.stdout)["results"][0]
    return result


def main() -> None:
    args = parser(__doc__, quick="the mlp alone", json_default="bench/results/lockstep-cpu.json").parse_args()
    if args.device != "cpu":
        raise SystemExit("bench/lockstep.py runs gloo ranks on the CPU; --device cpu only.")
    session = Session(torch.device("cpu"), ["torch"])
    print(session.machine())
    rows, lines = [], []
    for example, limit, max_batch_size in CASES[:1] if args.quick else CASES:
        alone = find(example, limit, max_batch_size, 1)
        together = find(example, limit, max_batch_size, 2)
        rows.append({"example": example, "limit": limit, "alone": alone, "two_ranks": together})
        lines.append(
            [
                f"{example} at {limit}",
                f"{alone['batch_size']} / {together['batch_size']}",
                f"{len(alone['trials'])} / {len(together['trials'])}",
                f"{alone['search_seconds']:.2f} s",
                f"{together['search_seconds']:.2f} s",
                ratio(together["search_seconds"], alone["search_seconds"]),
            ]
        )
    headers = ["case", "answer 1 / 2 ranks", "trials 1 / 2", "1 rank", "2 ranks", "2 ranks / 1"]
    print_text_table(headers, lines)
    save(args, session, RESULTS / "lockstep-cpu.json", {"rows": rows})


if __name__ == "__main__":
    main()

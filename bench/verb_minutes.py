"""Minutes per timing verb on the README's example: ``batchfit compare`` and ``batchfit advise`` on
the cnn under a 256 MiB cap, run as a user runs them (the command line, default budgets), on this
CPU and with oneDNN capped at AVX2 (a CPU without bfloat16 kernels, where autocast bfloat16 runs
about 20x slower a step).

    .venv/bin/python bench/verb_minutes.py                 # both verbs, both kernels
    .venv/bin/python bench/verb_minutes.py --quick         # compare only
    .venv/bin/python bench/verb_minutes.py --heldout-gpt   # on bench/_heldout_gpt.py's GPT instead

Each run's wall time is printed in minutes and as a ratio to the verb's budget
(``Timing.time_budget_seconds``, the whole verb's), with what the budget left out.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

import _harness

from batchfit.advice.advise import ADVISE_TIMING
from batchfit.comparison.compare import COMPARE_TIMING

DEFAULT_JSON = "bench/data/cpu-2026-12-08/verb-minutes.json"
HELDOUT_JSON = "bench/data/cpu-2026-12-08/verb-minutes-heldout-gpt.json"
CAP = ("--device", "cpu", "--memory-limit", "256MiB", "--format", "json")
#: The README's example, as its readers type it; and a GPT no rule was tuned on (the issue's case).
EXAMPLE = ("--example", "cnn", *CAP)
HELDOUT = ("--workload", "_heldout_gpt:gpt", *CAP)
BUDGETS = {"compare": COMPARE_TIMING.time_budget_seconds, "advise": ADVISE_TIMING.time_budget_seconds}
#: Kernels: this CPU's own, and oneDNN capped below AVX512-BF16.
KERNELS = {"own": None, "avx2": "AVX2"}


def run_verb(verb: str, isa: str | None, workload: tuple[str, ...] = EXAMPLE) -> dict[str, Any]:
    """One run of ``batchfit <verb>`` on ``workload``: wall seconds, the ratio to the budget, and what
    its result names as not measured or clearly slower."""
    env = {key: value for key, value in os.environ.items() if key != "ONEDNN_MAX_CPU_ISA"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_harness.ROOT / "bench"), env.get("PYTHONPATH")]))
    if isa is not None:
        env["ONEDNN_MAX_CPU_ISA"] = isa
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "batchfit", verb, *workload],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"batchfit {verb} exited {done.returncode}: {done.stderr[-2000:]}")
    (result,) = json.loads(done.stdout)["results"]
    comparison = result if verb == "compare" else result.get("comparison") or {}
    budget = BUDGETS[verb] or 0.0
    return {
        "verb": verb,
        "onednn_max_cpu_isa": isa,
        "seconds": seconds,
        "budget_seconds": budget,
        "over_budget": seconds / budget if budget else None,
        "not_measured": [part["part"] for part in result.get("not_measured", [])]
        + [f"compare: {part['part']}" for part in comparison.get("not_measured", []) if verb == "advise"],
        "slow_rows": [row["technique"] for row in comparison.get("rows", []) if row.get("slow")],
        "seconds_per_reading": comparison.get("seconds_per_reading"),
        "skipped": result.get("skipped", []),
        "progress_lines": sum(1 for line in done.stderr.splitlines() if line.startswith("batchfit: ")),
    }


def line(run: dict[str, Any]) -> list[str]:
    ratio = "-" if run["over_budget"] is None else f"{run['over_budget']:.2f}"
    return [
        run["verb"],
        run["onednn_max_cpu_isa"] or "own",
        f"{run['seconds'] / 60:.2f}",
        f"{run['budget_seconds']:.0f}",
        ratio,
        ", ".join(run["slow_rows"]) or "-",
        ", ".join(run["not_measured"]) or "-",
    ]


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    heldout = "--heldout-gpt" in argv
    argv = [arg for arg in argv if arg != "--heldout-gpt"]
    default = HELDOUT_JSON if heldout else DEFAULT_JSON
    args, session = _harness.start(
        __doc__, argv, quick="compare only", json_default=default, packages=("torch", "batchfit")
    )
    workload = HELDOUT if heldout else EXAMPLE
    verbs = ("compare",) if args.quick else ("compare", "advise")
    runs = []
    for verb in verbs:
        for kernels, isa in KERNELS.items():
            print(f"batchfit {verb} on {workload[1]}, kernels {kernels} ...", flush=True)
            runs.append(run_verb(verb, isa, workload))
            print("  " + " | ".join(line(runs[-1])), flush=True)
    headers = ["verb", "kernels", "minutes", "budget s", "time / budget", "slow rows", "not measured"]
    _harness.print_text_table(headers, [line(run) for run in runs])
    _harness.save(args, session, _harness.ROOT / default, {"example": list(workload), "runs": runs})


if __name__ == "__main__":
    main()

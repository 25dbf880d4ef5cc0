"""``batchfit compare`` on real models, each technique's largest batch checked by force.

    .venv/bin/python bench/compare.py                  # CPU: the built-in examples, capped, and a
                                                       # tiny GPT-2 where transformers is installed
    .venv/bin/python bench/compare.py --device cuda    # ResNet-50 and GPT-2 where installed, capped
    .venv/bin/python bench/compare.py --workloads cnn  # one case

For every row that applied, the truth is ``_truth.scan`` around the row's largest batch: which
batches train 10 steps, the technique applied the same way, under the comparison's budget, on the
model compare searched put back as built for each probe (weights, no optimizer state, GradScalers
unstepped, the cache emptied); the row's answer is judged on that curve, and trains 20 steps. On a
GPU the ratios are set beside the published ResNet-50 rows of an 11 GB RTX 2080 Ti (AMP 1.9x the
fp32 maximum; checkpointing per stage about 1.2x AMP's).
"""

from __future__ import annotations

import functools
import gc
from dataclasses import asdict
from typing import Any

import torch
from _capped import FreshState
from _harness import RESULTS, Session, parser, print_text_table, write_results
from _truth import CHECK_STEPS, Curve, judge, scan, settings
from _workloads import build, missing

import batchfit
from batchfit.comparison.comparison import Comparison
from batchfit.policy.explore.techniques import repeated_block
from batchfit.runtime.devices.oom import is_out_of_memory
from batchfit.runtime.devices.resolve import parse_device
from batchfit.runtime.steps.techniques import applied, module_blocks
from batchfit.runtime.workloads.batches import to_device

#: The bound of every search and of the truth.
MAX_BATCH_SIZE = 1024
#: (workload, memory limit) per device. On the CPU, limits whose answers stay under about 100, so
#: that the truth's scan (every size within 12%, 10 steps each) stays within minutes.
CASES = {
    "cpu": [
        ("mlp", "46MiB"),
        ("cnn", "64MiB"),
        ("transformer", "128MiB"),
        ("gpt2-tiny", "128MiB"),  # skipped without transformers
    ],
    "cuda": [("resnet50", "10.5GiB"), ("gpt2", "16GiB"), ("cnn", "1GiB")],
}
#: The settings per device (None: compare's defaults). On CUDA float16 with a GradScaler as well
#: as the device's own amp (bfloat16 on an H100): the published rows ran float16.
TECHNIQUES: dict[str, list[str] | None] = {
    "cpu": None,
    "cuda": [
        "amp",
        "amp-fp16",
        "checkpointing",
        "amp+checkpointing",
        "cudnn-benchmark-on",
        "expandable-segments",
    ],
}
#: The published ResNet-50 ratios (seed 004: RTX 2080 Ti, fp32 111 with cuDNN's benchmark off;
#: its AMP is float16 with a GradScaler, the only mixed precision that card runs).
ANCHORS = {"amp": 214 / 111, "amp-fp16": 214 / 111}


def fits(
    workload: batchfit.Workload,
    state: FreshState,
    parts: tuple[str, ...],
    block: str | None,
    budget: int,
    batch: int,
    steps: int,
) -> bool:
    """Whether ``steps`` steps of ``workload`` from its built state (``state``: the weights, no
    gradients, no optimizer state, GradScalers unstepped), ``parts`` applied, fit ``budget``. The
    model compare searched, in the place it was built: where the allocator maps pages into one
    segment (expandable segments), a model built anew sits elsewhere and the same batch can fit or
    not."""
    device = next(workload.model.parameters()).device
    state.restart()
    optimizer = state.optimizer  # the workload's own: its state is made by these steps
    try:
        with applied(workload, parts, device, block=block) as (variant, _):
            host = variant.host_batch(batch)
            with batchfit.cap_memory(budget, resident=[workload.model, optimizer], device=device):
                for _ in range(steps):
                    variant.run_train_step(optimizer, to_device(host, device))
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
        return True
    except Exception as error:  # cuDNN's "unable to find an engine" under the cap is one too
        if not is_out_of_memory(error):
            raise
        return False
    finally:
        optimizer.state.clear()  # nothing of this probe's optimizer stays resident for the next
        if device.type == "cuda":  # on the CPU nothing is cached, and a full collection costs 0.1 s
            gc.collect()
            torch.cuda.empty_cache()


def check(
    workload: batchfit.Workload, state: FreshState, comparison: Comparison, block: str | None
) -> list[Curve | None]:
    """The truth's curve for each row that has a largest batch (None for the others), on the model
    compare searched, put back to its built ``state`` for each probe."""
    truths: list[Curve | None] = []
    for row in comparison.rows:
        if (
            not row.applied
            or row.batch_size is None
            or row.accumulation_steps
            or comparison.budget_bytes is None
        ):
            truths.append(None)
            continue
        parts = () if row.technique == "baseline" else tuple(row.technique.split("+"))
        probe = functools.partial(fits, workload, state, parts, block, comparison.budget_bytes)
        truths.append(scan(probe, row.batch_size))
    return truths


def verdict_line(
    technique: str, answer: int, curve: Curve, anchor: float | None, ratio: float | None
) -> list[str]:
    """A row of the printed table: the answer, what it is judged against, and the verdict."""
    verdict = judge(curve, answer, MAX_BATCH_SIZE)
    said = "exact" if verdict.exact else f"judged against {verdict.reference}"
    if verdict.trains is False:
        said += f"; fails {CHECK_STEPS} steps"
    return [
        technique,
        str(answer),
        said,
        curve.describe(),
        "-" if ratio is None else f"{ratio:.2f}x",
        "-" if anchor is None else f"{anchor:.2f}x",
    ]


def case_dict(name: str, limit: str, comparison: Comparison, truths: list[Curve | None]) -> dict[str, Any]:
    """A case as the results file holds it: the comparison, each row's curve and verdict."""
    verdicts = [
        None
        if curve is None or row.batch_size is None
        else asdict(verdict := judge(curve, row.batch_size, MAX_BATCH_SIZE)) | {"exact": verdict.exact}
        for row, curve in zip(comparison.rows, truths, strict=True)
    ]
    return {
        "workload": name,
        "limit": limit,
        "comparison": asdict(comparison),
        "truths": [None if curve is None else curve.to_dict() for curve in truths],
        "verdicts": verdicts,
    }


def main() -> None:
    args = parser(__doc__, quick="the first case alone", json_default="bench/results/compare-DEVICE.json")
    args.add_argument(
        "--time-budget-seconds",
        type=float,
        default=0.0,
        help="the whole comparison's time (default: 0, no bound and no explore per row)",
    )
    args.add_argument("--workloads", default=None, help="comma-separated workloads (default: all)")
    options = args.parse_args()
    device = parse_device(options.device)
    cases = CASES[device.type][:1] if options.quick else CASES[device.type]
    if options.workloads is not None:
        wanted = options.workloads.split(",")
        unknown = sorted(set(wanted) - {name for name, _ in CASES[device.type]})
        if unknown:
            args.error(f"unknown workload(s) {', '.join(unknown)} on {device.type}")
        cases = [(name, limit) for name, limit in CASES[device.type] if name in wanted]
    session = Session(device, ["torch", "batchfit", "torchvision", "transformers"])
    print(session.machine())
    results = []
    for name, limit in cases:
        why = missing(name)
        if why:
            print(f"{name}: skipped, {why}")
            continue
        workload = build(name, device)
        state = FreshState(workload)  # the built weights, on the host
        comparison = batchfit.compare(
            workload,
            TECHNIQUES[device.type],
            device=device,
            memory_limit=limit,
            sizes=batchfit.BatchSizes(max_batch_size=MAX_BATCH_SIZE, global_batch_size=1024),
            # Every row searched, however slow a step: each row's answer is judged on its truth.
            timing=batchfit.Timing(time_budget_seconds=options.time_budget_seconds, time_slow=True),
        )
        block = repeated_block(module_blocks(workload.model))  # what compare wraps
        truths = check(workload, state, comparison, block)
        del workload
        print(f"\n{name} at {limit} ({comparison.seconds:.0f} s)")
        print(comparison.table(), end="")
        lines = [
            verdict_line(
                row.technique,
                row.batch_size,
                curve,
                ANCHORS.get(row.technique) if name == "resnet50" else None,
                row.batch_ratio,
            )
            for row, curve in zip(comparison.rows, truths, strict=True)
            if curve is not None and row.batch_size is not None
        ]
        print_text_table(["technique", "answer", "verdict", "truth", "x batch", "published x batch"], lines)
        results.append(case_dict(name, limit, comparison, truths))
    print(session.finish())
    if not options.no_json:
        path = options.json or RESULTS / f"compare-{device.type}.json"
        payload = {"truth": settings(), "max_batch_size": MAX_BATCH_SIZE, "cases": results}
        write_results(path, session, payload)


if __name__ == "__main__":
    main()

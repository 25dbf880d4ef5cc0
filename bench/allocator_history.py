"""Record CUDA's allocator history (``torch.cuda.memory._record_memory_history``) of a workload's
training trials at the batch sizes ``predict`` records (2, 4 and 8), each from the model as built
and the cache emptied: the requests a prediction replays, as CUDA itself served them.

Each trial's history is kept small enough to bring back from a GPU machine: its trace entries
without their stack frames, each as one string ``"ACTION ADDRESS SIZE STREAM"`` (``alloc``,
``free_requested``, ``free_completed``, ``segment_alloc``, ``segment_free``, ...), and the segments
the allocator held at the end (address, total, allocated and active bytes, pool). ``_snapshot()``
holds the rest (frames, blocks), which a person can record with the same calls.

Run (on a GPU): ``python bench/allocator_history.py --device cuda --workload resnet50 [--json F]``.
"""

from __future__ import annotations

import sys
from typing import Any

import _harness
import _workloads
import torch
from _capped import STEPS_PER_TRIAL, Bench, Case

from batchfit.prediction.predict import RECORD_SIZES

#: The most trace entries a trial keeps (torch's ring buffer): ResNet-50's two steps make about
#: 7,000; past it the oldest are dropped, which ``dropped`` says.
MAX_ENTRIES = 200_000


def history(bench: Bench, batch_size: int) -> dict[str, Any]:
    """One trial's allocator history: ``STEPS_PER_TRIAL`` training steps from the model as built,
    the cache emptied, uncapped."""
    workload, state = bench.workload()
    host = workload.host_batch(batch_size)
    torch.cuda.memory._record_memory_history(max_entries=MAX_ENTRIES)
    try:
        bench.train_steps(workload, state.optimizer, host, STEPS_PER_TRIAL)
        snapshot = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    state.reset()
    trace = snapshot["device_traces"][bench.device.index or 0]
    entries = [
        f"{entry['action']} {entry['addr']} {entry['size']} {entry.get('stream', 0)}" for entry in trace
    ]
    segments = [
        {
            "address": segment["address"],
            "total_size": segment["total_size"],
            "allocated_size": segment["allocated_size"],
            "active_size": segment["active_size"],
            "pool": "small" if segment.get("segment_type") == "small" else "large",
        }
        for segment in snapshot["segments"]
        if segment.get("device", 0) == (bench.device.index or 0)
    ]
    return {
        "batch_size": batch_size,
        "steps": STEPS_PER_TRIAL,
        "entries": entries,
        "dropped": len(trace) >= MAX_ENTRIES,
        "segments_at_end": segments,
        "peak_allocated_bytes": int(torch.cuda.max_memory_allocated(bench.device)),
    }


def main(argv: list[str] | None = None) -> int:
    parser = _harness.parser(
        __doc__, quick="batch 2 alone", json_default="bench/results/allocator-history-cuda-W.json"
    )
    parser.add_argument("--workload", required=True, help="a workload of bench/_workloads.py")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type != "cuda":
        parser.error("the allocator history is CUDA's: --device cuda")
    if (why := _workloads.missing(args.workload)) is not None:
        print(f"{args.workload}: skipped: {why}")
        return 0
    session = _harness.Session(device, ["torch", "batchfit", "torchvision", "transformers"])
    print(session.machine())
    bench = Bench(Case(args.workload, "uncapped"), device)
    bench.warm_up()
    trials = []
    for batch_size in RECORD_SIZES[:1] if args.quick else RECORD_SIZES:
        torch.cuda.reset_peak_memory_stats(device)
        trials.append(history(bench, batch_size))
        print(f"  batch {batch_size}: {len(trials[-1]['entries'])} trace entries", flush=True)
    path = _harness.RESULTS / f"allocator-history-cuda-{args.workload}.json"
    _harness.save(args, session, path, {"workload": args.workload, "trials": trials})
    return 0


if __name__ == "__main__":
    sys.exit(main())

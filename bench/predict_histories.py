"""CUDA's recorded allocator histories (``bench/allocator_history.py``, H200) against batchfit's
model: each trial's own requests on the model of the caching allocator (its segments and reserved
bytes beside CUDA's), ``predict``'s replay of batch 2 and 4's requests at batch 8 beside CUDA's batch
8, and ``predict --device cpu``'s recording (its fake-tensor trace, CUDA's allocator modelled,
cuBLAS's workspaces added, the optimizer foreach, attention as CUDA's fused kernel) at 2, 4 and 8
beside CUDA's, where the CPU runs it here (not cuDNN's convolution workspaces: ResNet-50's are not
modelled).

Run (CPU only): ``python bench/predict_histories.py [--json F]``.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import _harness
import _histories
import _workloads
import torch
from _capped import STEPS_PER_TRIAL

from batchfit.options import Trials
from batchfit.policy.capacity.capacity_prediction import CapacityPredictor
from batchfit.policy.capacity.cards import cublas_workspaces
from batchfit.policy.search.search_state import Candidates
from batchfit.prediction.cpu_alone import cuda_defaults
from batchfit.prediction.predict import CPU_RECORDING_BYTES, record_traced
from batchfit.runtime.devices.caching_device import CachingCpuDevice

#: The workloads predicted from the CPU alone here, by its fake-tensor trace (seconds, GPT-2 small
#: too, and ResNet-50 fp32 from ``_resnet.py`` without torchvision). ResNet-50 AMP and ViT-B/16
#: need torchvision.
CPU_ALONE = ("mlp", "cnn", "transformer", "resnet50", "gpt2")


def model_rows(workload: str) -> list[dict[str, Any]]:
    """Each trial's requests on the model against what CUDA's allocator did with them."""
    rows = []
    for batch_size, history in sorted(_histories.histories(workload).items()):
        run = _histories.model_run(history)
        rows.append(
            {
                "workload": workload,
                "batch_size": batch_size,
                "cuda_segments": sorted(history.segment_sizes),
                "model_segments": sorted(run.segment_sizes),
                "cuda_reserved_bytes": history.reserved_bytes,
                "model_reserved_bytes": run.reserved_bytes,
                "model_peak_reserved_bytes": run.peak_reserved_bytes,
                "cuda_peak_allocated_bytes": history.peak_allocated_bytes,
                "model_peak_allocated_bytes": run.peak_allocated_bytes,
                "requests": run.requests,
                "placed_alike": run.placed_alike,
                "first_apart": run.first_apart,
            }
        )
    return rows


def replay_row(workload: str) -> dict[str, Any]:
    """``predict``'s replay of batch 2 and 4's CUDA requests, played at 8 for 2 steps uncapped,
    against CUDA's batch 8; and the largest batch it places under what CUDA's batch 8 reserved."""
    histories = _histories.histories(workload)
    eight = histories[8]
    row: dict[str, Any] = {"workload": workload, "cuda_peak_allocated_bytes": eight.peak_allocated_bytes}
    row |= {"cuda_reserved_bytes": eight.reserved_bytes}
    row |= {"cuda_reserved_by_batch": {str(b): histories[b].reserved_bytes for b in (2, 4)}}
    records = {size: _histories.record_of(histories[size]) for size in (2, 4)}
    try:
        predictor = CapacityPredictor(records, STEPS_PER_TRIAL)
    except ValueError as error:
        counts = {str(size): sum(len(step) for step in r.steps) for size, r in records.items()}
        return row | {"aligned": False, "why": str(error), "events": counts}
    played = predictor.play(8, None)
    largest = predictor.largest(eight.reserved_bytes, Candidates.between(1, 512))
    return row | {
        "aligned": True,
        "replay_peak_allocated_bytes": played.peak_allocated_bytes,
        "replay_peak_reserved_bytes": played.peak_reserved_bytes,
        "largest_under_cuda_reserved_at_8": largest,
    }


def cpu_alone_row(workload: str) -> dict[str, Any]:
    """``predict --device cpu``'s records (2, 4, 8), replayed as it replays them (its pair, with
    Hopper's cuBLAS workspace kept) at 2, 4 and 8 for 2 steps, against CUDA's trials."""
    started = time.perf_counter()
    built = _workloads.build(workload, torch.device("cpu"))
    device = CachingCpuDevice(CPU_RECORDING_BYTES, fake=True)
    with cuda_defaults(built.optimizer):
        records, _ = record_traced(built, "train", 1.0, Trials(steps_per_trial=STEPS_PER_TRIAL))
    kept = cublas_workspaces(hopper=True)
    predictor = CapacityPredictor(records, STEPS_PER_TRIAL, device.soft_workspaces, kept)
    histories = _histories.histories(workload)
    points = []
    for batch_size in (2, 4, 8):
        played = predictor.play(batch_size, None)
        points.append(
            {
                "batch_size": batch_size,
                "cpu_peak_allocated_bytes": played.peak_allocated_bytes,
                "cpu_peak_reserved_bytes": played.peak_reserved_bytes,
                "cuda_peak_allocated_bytes": histories[batch_size].peak_allocated_bytes,
                "cuda_reserved_bytes": histories[batch_size].reserved_bytes,
            }
        )
    pair = predictor.replays[0][0]
    return {
        "workload": workload,
        "pair": list(pair),
        "points": points,
        "seconds": time.perf_counter() - started,
    }


def main(argv: list[str] | None = None) -> int:
    args, session = _harness.start(
        __doc__,
        argv,
        quick="the model and the replay only",
        json_default="bench/results/predict-histories-cpu.json",
        packages=["torch", "batchfit", "torchvision", "transformers"],
    )
    model = [row for workload in _histories.WORKLOADS for row in model_rows(workload)]
    replay = [replay_row(workload) for workload in _histories.WORKLOADS]
    alone = [] if args.quick else [cpu_alone_row(workload) for workload in CPU_ALONE]
    for row in model:
        print(f"  {row['workload']} {row['batch_size']}: model {row['model_reserved_bytes']}, "
              f"CUDA {row['cuda_reserved_bytes']} reserved")  # fmt: skip
    payload = {"histories": _histories.recorded(), "model": model, "replay": replay, "cpu_alone": alone}
    payload["cpu_alone_skipped"] = SKIPPED
    _harness.save(args, session, _harness.RESULTS / "predict-histories-cpu.json", payload)
    return 0


#: The workloads not predicted from the CPU alone here, and why.
SKIPPED = {
    "resnet50-amp": "torchvision is not installed on this CPU machine",
    "vit-b16": "torchvision is not installed on this CPU machine",
}


if __name__ == "__main__":
    sys.exit(main())

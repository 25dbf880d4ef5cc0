"""Benchmark ``predict --device cpu``'s two ways of recording: a fake-tensor trace of its trials and
the real small trials on the CPU, both with CUDA's caching allocator modelled.

For each workload and mode, ``record`` (the real trials, batch 2, 4 and 8, 2 steps each) and
``record_traced`` (the same trials run on a fake copy of the model) are timed, with the optimizer's
foreach step set as predict sets it from the CPU alone; their records are compared request for
request, and each record set is replayed (``CapacityPredictor``, 10 steps, cuBLAS's Hopper
workspace kept) at each target's budget (0.8 of its memory less its CUDA context): the answers
of both. A large causal LM built on the meta device (2.4 billion parameters) is traced
alone: no real trial can run it.

Run: ``python bench/predict_trace.py [--json F]`` (CPU only; about a minute).
"""

from __future__ import annotations

import sys
import time
from typing import Any

import _harness
import _workloads
import torch
from torch import nn

import batchfit
from batchfit import Targets, Trials
from batchfit.policy.allocator.allocation_record import AllocationRecord
from batchfit.policy.capacity.capacity_prediction import CapacityPredictor
from batchfit.policy.capacity.cards import cublas_workspaces
from batchfit.policy.search.trial import Mode
from batchfit.prediction.cpu_alone import cuda_defaults
from batchfit.prediction.predict import CPU_RECORDING_BYTES, record, record_traced
from batchfit.runtime.devices.caching_device import CachingCpuDevice
from batchfit.runtime.workloads.examples import TinyLM

PACKAGES = ("torch", "batchfit", "transformers")
WORKLOADS = ("cnn", "transformer", "gpt2-tiny")
#: The targets: two small capacities (totals, less the default CUDA context), where the small
#: workloads' answers fall below the largest candidate, and a card.
TARGETS = ("1GiB", "4GiB", "H100-80GB")
META_LM = "lm-2.4b (meta)"


def meta_lm() -> batchfit.Workload:
    """A 12-layer causal LM of width 4096 (2.4 billion parameters, 9.1 GiB in float32) on 512-token
    sequences with AdamW, built on the meta device: nothing allocated."""
    with torch.device("meta"):
        model = TinyLM(vocab=32000, seq_len=512, width=4096, layers=12)

    def make_batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.randint(0, 32000, (n, 513), generator=torch.Generator().manual_seed(n))
        return ids[:, :-1], ids[:, 1:]

    def loss_fn(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))

    return batchfit.Workload(
        model, torch.optim.AdamW(model.parameters()), make_batch=make_batch, loss_fn=loss_fn, name=META_LM
    )


def answers(records: dict[int, AllocationRecord], mode: Mode) -> dict[str, int | None]:
    """The replay's answer at each target's budget, as predict from the CPU alone replays."""
    kept = cublas_workspaces(hopper=True)
    predictor = CapacityPredictor(records, 10, False, kept)
    candidates = batchfit.BatchSizes().candidates(mode)
    memories = Targets(capacities=TARGETS[:2], gpus=TARGETS[2:]).memories()
    return {memory.name: predictor.predict(memory, candidates).batch_size for memory, _ in memories}


def timed(call: Any) -> tuple[Any, float]:
    began = time.perf_counter()
    result = call()
    return result, time.perf_counter() - began


def measure(workload: batchfit.Workload, mode: Mode, real: bool) -> dict[str, Any]:
    """One mode's records both ways (the trace alone where ``real`` is False), timed and compared."""
    with cuda_defaults(workload.optimizer):
        (traced, _), trace_seconds = timed(lambda: record_traced(workload, mode, 0.8, Trials(), 1))
        trials: dict[int, AllocationRecord] | None = None
        trial_seconds = None
        if real:
            device = CachingCpuDevice(CPU_RECORDING_BYTES)
            (trials, _), trial_seconds = timed(lambda: record(workload, mode, device, 0.8, Trials(), 1))
    return {
        "workload": workload.name,
        "mode": mode,
        "trace_seconds": trace_seconds,
        "trial_seconds": trial_seconds,
        "requests": {size: sum(len(step) for step in each.steps) for size, each in traced.items()},
        "equal": None if trials is None else trials == traced,
        "traced_answers": answers(traced, mode),
        "trial_answers": None if trials is None else answers(trials, mode),
    }


def main(argv: list[str] | None = None) -> int:
    args, session = _harness.start(
        __doc__,
        argv,
        quick="the cnn alone",
        json_default="bench/results/predict-trace.json",
        packages=PACKAGES,
    )
    rows = []
    built = [(name, True) for name in (WORKLOADS[:1] if args.quick else WORKLOADS)]
    for name, real in [*built, *([] if args.quick else [(META_LM, False)])]:
        if (why := None if name == META_LM else _workloads.missing(name)) is not None:
            print(f"{name}: skipped: {why}")
            continue
        for mode in ("train", "eval") if real else ("train",):
            workload = meta_lm() if name == META_LM else _workloads.build(name, torch.device("cpu"))
            rows.append(measure(workload, mode, real))
            print(f"  {name} {mode}: {rows[-1]}", flush=True)
    _harness.save(args, session, _harness.RESULTS / "predict-trace.json", {"rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())

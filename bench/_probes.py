"""The probes of ``bench/predict.py``: the truth's (TRUTH_STEPS steps of a mode under a cap, from
an emptied cache, eval with the training state resident as ``find`` holds it) and MemTracker's
answer (the largest batch whose tracked peak stays within the cap), both on a bench's workload."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from _capped import STEPS_PER_TRIAL, Bench

from batchfit import BatchSizes, Workload
from batchfit.policy.capacity.capacity_prediction import largest_placed
from batchfit.policy.capacity.cards import cublas_workspaces
from batchfit.policy.search.trial import Mode
from batchfit.prediction.cpu_alone import cuda_defaults
from batchfit.runtime.devices.oom import is_out_of_memory
from batchfit.runtime.workloads.batches import to_device

#: The candidates every method answers from: up to 4096 (ResNet-50 at 80 GiB trains past 512).
MAX_BATCH_SIZE = 4096


def memtracker_peak(bench: Bench, batch_size: int, mode: Mode = "train", warm: int = 1) -> int | None:
    """MemTracker's peak over a 2-step trial of ``mode`` at ``batch_size`` from the model as built,
    uncapped (eval: after a training step at ``warm``, as find's eval trials run); None where the
    device ran out of memory (on CUDA: the GPU's own)."""
    from torch.distributed._tools.mem_tracker import MemTracker

    workload, state = bench.workload()
    host = workload.host_batch(batch_size)
    tracker = MemTracker()
    tracker.track_external(state.model, state.optimizer)
    try:
        with tracker:
            if mode == "eval":
                workload.run_train_step(state.optimizer, to_device(workload.host_batch(warm), bench.device))
                state.model.eval()
                tracker.reset_mod_stats()
            for step in range(STEPS_PER_TRIAL):
                run_step(workload, state.optimizer, mode, to_device(host, bench.device))
                if step == 0:  # MemTracker tracks one iteration of each module's stats at a time
                    tracker.reset_mod_stats()
        if bench.device.type == "cuda":
            torch.cuda.synchronize(bench.device)
    except torch.OutOfMemoryError:
        state.reset()
        return None
    peaks = tracker.get_tracker_snapshot("peak")
    device = next(key for key in peaks if torch.device(key).type == bench.device.type)
    state.reset()
    return int(peaks[device]["Total"])


def memtracker_answer(
    bench: Bench, cap_bytes: int, peaks: dict[int, int], mode: Mode = "train", warm: int = 1
) -> int | None:
    """The largest candidate whose MemTracker peak is at most ``cap_bytes`` (``peaks``: measured
    so far, by batch size, filled in)."""

    def fits(batch_size: int) -> bool:
        if batch_size not in peaks:
            peak = memtracker_peak(bench, batch_size, mode, warm)
            peaks[batch_size] = -1 if peak is None else peak  # -1: out of memory
        return 0 <= peaks[batch_size] <= cap_bytes

    return largest_placed(fits, BatchSizes(max_batch_size=MAX_BATCH_SIZE).candidates(mode))


def run_step(workload: Workload, optimizer: torch.optim.Optimizer, mode: Mode, batch: Any) -> None:
    if mode == "train":
        workload.run_train_step(optimizer, batch)
    else:
        workload.run_eval_step(batch)


def truth_probe(bench: Bench, mode: Mode, warm: int, as_cuda: bool = False) -> Callable[[int, int], bool]:
    """The truth's probe in ``mode``: ``steps`` steps under the cap from the model as built, the
    cache emptied; eval first makes the training state resident with a training step at ``warm``
    under the same cap, as find's eval trials do. ``as_cuda``: with what the CPU-alone path adds
    for CUDA, cuBLAS's workspaces (Hopper's, as a capacity in bytes takes) each in a segment of its
    own from the start and the optimizer's foreach step."""

    def probe(batch_size: int, steps: int) -> bool:
        workload, state = bench.workload()
        host = workload.host_batch(batch_size)  # outside the cap, like batchfit's data
        warm_host = workload.host_batch(warm) if mode == "eval" else None
        try:
            with cuda_defaults(state.optimizer, as_cuda), bench.capped(state):
                kept = None
                if as_cuda:  # allocated first: each a segment of its own, as the replay adds them
                    kept = [
                        torch.empty(nbytes, dtype=torch.uint8, device=bench.device)
                        for nbytes in cublas_workspaces(hopper=True)
                    ]
                if warm_host is not None:
                    workload.run_train_step(state.optimizer, to_device(warm_host, bench.device))
                    state.model.eval()
                for _ in range(steps):
                    run_step(workload, state.optimizer, mode, to_device(host, bench.device))
                if bench.device.type == "cuda":
                    torch.cuda.synchronize(bench.device)
                del kept
        except Exception as error:
            if not is_out_of_memory(error):
                raise
            del error
            return False
        finally:
            state.reset()
        return True

    return probe

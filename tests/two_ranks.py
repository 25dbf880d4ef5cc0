"""Two real ranks for the ``distributed`` tests: spawned Pythons in a gloo group, each under a
deadline, the way a rank leaves the group, and a DDP model that counts its all-reduces."""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

#: Generous for a 2-core machine that starts two Pythons importing torch; a hang takes longer.
TIMEOUT_SECONDS = 45


def run_ranks(target: Callable[..., None], args: tuple[Any, ...], what: str) -> None:
    """``target(rank, 2, *args)`` on two spawned ranks; fails when either is still running after
    TIMEOUT_SECONDS (``what`` hung) or did not exit cleanly."""
    context = multiprocessing.get_context("spawn")
    ranks = [context.Process(target=target, args=(rank, 2, *args)) for rank in range(2)]
    for process in ranks:
        process.start()
    deadline = time.monotonic() + TIMEOUT_SECONDS
    for process in ranks:
        process.join(max(0.0, deadline - time.monotonic()))
    hung = [rank for rank, process in enumerate(ranks) if process.is_alive()]
    for process in ranks:
        if process.is_alive():
            process.kill()
    assert not hung, f"ranks {hung} still running after {TIMEOUT_SECONDS} s: {what} hung"
    assert [process.exitcode for process in ranks] == [0, 0]


def report_and_leave(out: str, rank: int, make: Callable[[], dict[str, Any]]) -> None:
    """Write ``make()``'s report (or the error it raised, its notes too) with the seconds it took to
    ``out/<rank>.json``, then leave the group (``leave_group``)."""
    started = time.perf_counter()
    report: dict[str, Any]
    try:
        report = make()
    except BaseException as error:
        notes = getattr(error, "__notes__", [])
        report = {"error": type(error).__name__, "message": str(error), "notes": notes}
    report["seconds"] = time.perf_counter() - started
    Path(out, f"{rank}.json").write_text(json.dumps(report))
    leave_group()


def leave_group() -> None:
    """Leave together, then exit without C++ teardown. No rank exits before every rank is done
    with the group (told through its store, not gloo): a rank that tears gloo down while the other
    still talks to it aborts. Nor is the group destroyed: on torch 2.4 ``destroy_process_group``
    sometimes never returned (1 run of the lockstep tests in 5), and torch 2.13's CPU build
    sometimes aborts at interpreter exit after a gloo group ("terminate called without an active
    exception", about 1 run in 8 on 2 cores), both after the rank's work is done and reported."""
    store = dist.distributed_c10d._get_default_store()
    rank, world_size = dist.get_rank(), dist.get_world_size()
    dist.barrier()
    store.set(f"left/{rank}", "1")
    store.wait([f"left/{each}" for each in range(world_size)], timedelta(seconds=TIMEOUT_SECONDS))
    # Rank 0 leaves last: its process may host the store (a TCPStore, as torchrun's and
    # Lightning's env:// groups have), which the others' waits still read from.
    if rank == 0:
        gone = [f"gone/{each}" for each in range(1, world_size)]
        store.wait(gone, timedelta(seconds=TIMEOUT_SECONDS))
    else:
        store.set(f"gone/{rank}", "1")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def counting_ddp(model: nn.Module) -> tuple[DistributedDataParallel, list[int]]:
    """``model`` in DistributedDataParallel, and a one-element list counting its all-reduces."""
    wrapped = DistributedDataParallel(model)
    allreduces = [0]

    def counting_allreduce(counter, bucket):  # unannotated: DDP rejects string annotations
        counter[0] += 1
        return default_hooks.allreduce_hook(None, bucket)

    wrapped.register_comm_hook(allreduces, counting_allreduce)
    return wrapped, allreduces

"""Train with batch sizes from an experiment config, searched at start-up when AUTOBATCH asks.

    python examples/train.py --cfg examples/exp.yaml DATA.AUTOBATCH.ENABLED True
    python examples/train.py --cfg examples/exp.yaml --steps 5 DATA.BATCH_SIZE 16
    torchrun --nproc_per_node=2 examples/train.py --cfg examples/exp.yaml DATA.AUTOBATCH.ENABLED True

It loads the config (KEY VALUE overrides after the options), builds the workload, runs
``batchfit.apply_autobatch`` (which overwrites DATA.BATCH_SIZE / DATA.BATCH_SIZE_VAL when
DATA.AUTOBATCH.ENABLED / ENABLED_VAL), then trains ``--steps`` steps at DATA.BATCH_SIZE and
evaluates one batch at DATA.BATCH_SIZE_VAL, inside the config's memory limit.

Under torchrun every rank joins one process group first (gloo on the CPU, NCCL on GPUs, one GPU
per LOCAL_RANK) and wraps the model in DistributedDataParallel, so the search runs on all ranks in
lockstep, counts DDP's gradient buckets, and every rank trains at the same size, the one that fits
the smallest device. (A trial runs the wrapper's module: no collective that an out-of-memory on one
rank could leave waiting.) Rank 0 prints the report.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import batchfit
from batchfit import apply_autobatch, load_config, load_workload
from batchfit.analysis.config import ExperimentConfig


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cfg", type=Path, required=True, help="the experiment config (YAML)")
    parser.add_argument("--steps", type=int, default=3, help="training steps (default: %(default)s)")
    parser.add_argument("overrides", nargs="*", metavar="KEY VALUE", help="config overrides")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s", stream=sys.stderr)
    try:
        cfg = load_config(args.cfg, args.overrides)
        with _process_group(cfg) as rank:
            if rank != 0:  # rank 0 tells the search; the others only warn
                logging.getLogger().setLevel(logging.WARNING)
            workload = load_workload(cfg.WORKLOAD, device=cfg.DEVICE, source="WORKLOAD")
            # Searched as it trains: DDP's buckets are memory too (a built-in example comes wrapped).
            if dist.is_initialized() and not isinstance(workload.model, DistributedDataParallel):
                device = next(workload.model.parameters()).device
                ids = [device.index] if device.type == "cuda" else None
                workload = dataclasses.replace(
                    workload, model=DistributedDataParallel(workload.model, device_ids=ids)
                )
            apply_autobatch(cfg, workload)  # every rank together under a process group
            report = train(cfg, workload, args.steps)
    except batchfit.BatchfitError as error:
        if os.environ.get("BATCHFIT_DEBUG", "") not in ("", "0"):
            traceback.print_exc()
        print(f"train: error: {error}", file=sys.stderr)
        return 1
    if rank == 0:
        print(json.dumps(report))
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        # torch 2.13's CPU build sometimes aborts in the C++ teardown at exit after a gloo group
        # ("terminate called without an active exception"): a finished rank leaves without it.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0


@contextlib.contextmanager
def _process_group(cfg: ExperimentConfig) -> Iterator[int]:
    """Under torchrun (WORLD_SIZE > 1), join its process group for the block; yields the rank."""
    if int(os.environ.get("WORLD_SIZE", "1")) == 1:
        yield 0
        return
    cuda = cfg.DEVICE != "cpu" and torch.cuda.is_available()
    if cuda and cfg.DEVICE in (None, "cuda"):
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))  # "cuda" is this rank's own GPU
    dist.init_process_group("nccl" if cuda else "gloo")
    try:
        yield dist.get_rank()
    except BaseException:
        dist.destroy_process_group()
        raise
    dist.barrier()  # leave together: a rank that tears gloo down while another still talks to it aborts
    dist.destroy_process_group()


def train(cfg: ExperimentConfig, workload: batchfit.Workload, steps: int) -> dict[str, object]:
    """A few real training steps and one evaluation batch, at the config's batch sizes."""
    network, model, optimizer = workload.model, workload.module, workload.build_optimizer()
    if optimizer is None or workload.loss_fn is None:
        raise batchfit.ConfigurationError(
            f"WORKLOAD {cfg.WORKLOAD!r} has no optimizer or loss_fn; examples/train.py trains "
            f"workloads that have both."
        )
    losses = []
    device = next(model.parameters()).device  # the config's DEVICE: the workload was built there
    # A DDP built before the cap counts its buckets from its first backward, which writes into them.
    with _capped(cfg.MEMORY_LIMIT, device, network, optimizer):
        network.train()
        for _ in range(steps):
            inputs, target = workload.host_batch(cfg.DATA.BATCH_SIZE)
            optimizer.zero_grad(set_to_none=True)
            loss = workload.loss_fn(network(inputs.to(device, copy=True)), target.to(device, copy=True))
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        network.eval()
        with torch.no_grad():
            inputs, target = workload.host_batch(cfg.DATA.BATCH_SIZE_VAL)
            inputs, target = inputs.to(device, copy=True), target.to(device, copy=True)
            val_loss = workload.loss_fn(model(inputs), target).item()
    sizes = [(cfg.DATA.BATCH_SIZE, cfg.DATA.BATCH_SIZE_VAL)]
    if dist.is_initialized():  # what each rank trained at, for the report
        sizes = [(0, 0)] * dist.get_world_size()
        dist.all_gather_object(sizes, (cfg.DATA.BATCH_SIZE, cfg.DATA.BATCH_SIZE_VAL))
    return {
        "batch_size": cfg.DATA.BATCH_SIZE,
        "batch_size_val": cfg.DATA.BATCH_SIZE_VAL,
        "sizes_by_rank": sizes,
        "train_losses": losses,
        "val_loss": val_loss,
    }


@contextlib.contextmanager
def _capped(limit: str | None, device: torch.device, *resident: object) -> Iterator[None]:
    """Train under the same cap the search measured with, when the config sets one."""
    if limit is None:
        yield
        return
    with batchfit.cap_memory(limit, resident=resident, device=device):
        yield


if __name__ == "__main__":
    raise SystemExit(main())

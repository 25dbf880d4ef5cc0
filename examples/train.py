"""Train with batch sizes from an experiment config, searched at start-up when AUTOBATCH asks.

    python examples/train.py --cfg examples/exp.yaml DATA.AUTOBATCH.ENABLED True
    python examples/train.py --cfg examples/exp.yaml --steps 5 DATA.BATCH_SIZE 16

It loads the config (KEY VALUE overrides after the options), builds the workload, runs
``batchfit.apply_autobatch`` (which overwrites DATA.BATCH_SIZE / DATA.BATCH_SIZE_VAL when
DATA.AUTOBATCH.ENABLED / ENABLED_VAL), then trains ``--steps`` steps at DATA.BATCH_SIZE and
evaluates one batch at DATA.BATCH_SIZE_VAL, inside the config's memory limit.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path

import torch

import batchfit
from batchfit.autobatch import apply_autobatch, workload_from_config
from batchfit.config import ExperimentConfig, load_config


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cfg", type=Path, required=True, help="the experiment config (YAML)")
    parser.add_argument("--steps", type=int, default=3, help="training steps (default: %(default)s)")
    parser.add_argument("overrides", nargs="*", metavar="KEY VALUE", help="config overrides")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s", stream=sys.stderr)
    try:
        cfg = load_config(args.cfg, args.overrides)
        workload = workload_from_config(cfg)
        apply_autobatch(cfg, workload)
        report = train(cfg, workload, args.steps)
    except batchfit.BatchfitError as error:
        if os.environ.get("BATCHFIT_DEBUG", "") not in ("", "0"):
            traceback.print_exc()
        print(f"train: error: {error}", file=sys.stderr)
        return 1
    print(json.dumps(report))
    return 0


def train(cfg: ExperimentConfig, workload: batchfit.Workload, steps: int) -> dict[str, object]:
    """A few real training steps and one evaluation batch, at the config's batch sizes."""
    model, optimizer = workload.model, workload.build_optimizer()
    if optimizer is None or workload.loss_fn is None:
        raise batchfit.ConfigurationError(
            f"WORKLOAD {cfg.WORKLOAD!r} has no optimizer or loss_fn; examples/train.py trains "
            f"workloads that have both."
        )
    losses = []
    device = next(model.parameters()).device  # the config's DEVICE: the workload was built there
    with _capped(cfg.MEMORY_LIMIT, device, model, optimizer):
        model.train()
        for _ in range(steps):
            inputs, target = workload.host_batch(cfg.DATA.BATCH_SIZE)
            optimizer.zero_grad(set_to_none=True)
            loss = workload.loss_fn(model(inputs.to(device, copy=True)), target.to(device, copy=True))
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        model.eval()
        with torch.no_grad():
            inputs, target = workload.host_batch(cfg.DATA.BATCH_SIZE_VAL)
            inputs, target = inputs.to(device, copy=True), target.to(device, copy=True)
            val_loss = workload.loss_fn(model(inputs), target).item()
    return {
        "batch_size": cfg.DATA.BATCH_SIZE,
        "batch_size_val": cfg.DATA.BATCH_SIZE_VAL,
        "train_losses": losses,
        "val_loss": val_loss,
    }


@contextlib.contextmanager
def _capped(limit: str | None, device: torch.device, *resident: object) -> Iterator[None]:
    """Train under the same cap the search measured with, when the config sets one."""
    if limit is None:
        yield
        return
    with batchfit.memory_limit(limit, resident=resident, device=device):
        yield


if __name__ == "__main__":
    raise SystemExit(main())

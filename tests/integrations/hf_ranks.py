"""Run by ``torchrun --nproc_per_node=2 hf_ranks.py OUT [CAP]``: each rank fits a tiny GPT-2's batch
sizes with the Trainer adapter (rank 0 on a 24 MiB device, rank 1 on a 12 MiB one), trains two
optimizer steps (rank 1 under CAP, a smaller device, where given), and writes what it found, what it
trained at and the weights it ended with to ``OUT/<rank>.json``."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path

import torch
import transformers
from hf_models import gpt2, language_modelling, token_examples
from transformers import TrainingArguments

import batchfit
from batchfit.integrations.transformers import BatchfitTrainer


def main(out: Path) -> None:
    transformers.logging.set_verbosity_error()
    rank = int(os.environ["RANK"])
    args = TrainingArguments(
        output_dir=str(out / "run"),
        use_cpu=True,
        ddp_backend="gloo",
        report_to=[],
        disable_tqdm=True,
        save_strategy="no",
        logging_strategy="no",
        per_device_train_batch_size=32,
        max_steps=2,
    )
    trainer = BatchfitTrainer(
        model=gpt2(),
        args=args,
        train_dataset=token_examples(128),
        data_collator=language_modelling,
        memory_limit=("24MiB", "12MiB")[rank],
    )
    plan = trainer.fit_batch_sizes()
    cap = sys.argv[2] if rank == 1 and len(sys.argv) > 2 else None  # rank 1 trains on a smaller device
    with batchfit.cap_memory(cap, resident=[trainer.model]) if cap else contextlib.nullcontext():
        trainer.train()
    assert plan.train is not None
    report = {
        "plan": {**plan.to_dict(evidence=False), "device": None},  # the device's name is each rank's own
        "capacity_bytes": plan.train.capacity_bytes,
        "world_size": plan.train.world_size,
        "global_step": trainer.state.global_step,
        "trained": {**trainer.batchfit_plan.to_dict(evidence=False), "device": None},
        "weights": [float(parameter.detach().double().sum()) for parameter in trainer.model.parameters()],
    }
    (out / f"{rank}.json").write_text(json.dumps(report))
    # The Trainer leaves its gloo group up: both ranks leave it together, so neither exits while the
    # other's gloo threads still talk to it.
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))

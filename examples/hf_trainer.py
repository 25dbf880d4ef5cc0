"""Fine-tune a Hugging Face model with the Trainer, its batch sizes fitted by batchfit.

    python examples/hf_trainer.py                         # a tiny GPT-2 on a CPU standing in for 8 MiB
    python examples/hf_trainer.py --memory-limit 64MiB --steps 20
    python examples/hf_trainer.py --resume                # from the last checkpoint, at its recorded plan
    torchrun --nproc_per_node=2 examples/hf_trainer.py    # every rank takes the smallest device's sizes

The script is the usual Trainer script with ``Trainer`` replaced by ``BatchfitTrainer``: before
training it searches the Trainer's own step for the largest micro-batch that fits and the largest
eval batch, keeps ``per_device_train_batch_size x gradient_accumulation_steps x world_size`` as the
arguments ask (here 48 x 1), and records the plan in each checkpoint. The model is built from a
config and the data are random tokens, so nothing is downloaded. On a GPU, drop ``use_cpu`` and pass
``--memory-limit ''``: the search then measures the card itself.
"""

from __future__ import annotations

import argparse
import logging

import torch
import transformers
from transformers import GPT2Config, GPT2LMHeadModel, TrainingArguments

from batchfit.integrations.transformers import BatchfitTrainer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--memory-limit", default="8MiB", help="the device's memory (a CPU standing in for one)"
    )
    parser.add_argument("--steps", type=int, default=10, help="optimizer steps to train")
    parser.add_argument("--output-dir", default="hf_trainer_run", help="where checkpoints go")
    parser.add_argument("--resume", action="store_true", help="resume from the last checkpoint")
    options = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")  # batchfit's progress, at INFO
    transformers.logging.set_verbosity_error()

    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=2, n_head=2, n_embd=64, vocab_size=256, n_positions=32, bos_token_id=0, eos_token_id=0
    )
    model = GPT2LMHeadModel(config)
    tokens = torch.randint(0, 256, (512, 32), generator=torch.Generator().manual_seed(0))
    train = [{"input_ids": row.tolist()} for row in tokens[:448]]
    test = [{"input_ids": row.tolist()} for row in tokens[448:]]

    args = TrainingArguments(
        output_dir=options.output_dir,
        use_cpu=True,
        bf16=True,  # mixed precision as the Trainer runs it (bf16 on the CPU)
        per_device_train_batch_size=48,  # the batch to train at: kept, as micro-batches x accumulation
        max_steps=options.steps,
        eval_strategy="steps",
        eval_steps=options.steps,
        save_steps=max(options.steps // 2, 1),
        logging_steps=max(options.steps // 2, 1),
        report_to=[],
        disable_tqdm=True,
    )
    trainer = BatchfitTrainer(
        model=model,
        args=args,
        train_dataset=train,
        eval_dataset=test,
        data_collator=language_modelling,
        memory_limit=options.memory_limit or None,  # leave out on a GPU: the card is measured
    )
    result = trainer.train(resume_from_checkpoint=True if options.resume else None)
    if trainer.is_world_process_zero():
        plan = trainer.batchfit_plan
        assert plan is not None
        print(f"{plan.source}: {plan.summary()}")
        print(f"trained {result.global_step} steps, loss {result.training_loss:.3f}")


def language_modelling(examples: list[dict[str, list[int]]]) -> dict[str, torch.Tensor]:
    ids = torch.tensor([example["input_ids"] for example in examples])
    return {"input_ids": ids, "labels": ids.clone()}


if __name__ == "__main__":
    main()

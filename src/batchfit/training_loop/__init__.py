"""What runs inside the user's training loop: ``MicroBatchStep`` (one optimizer step as micro-batches,
halved after an out-of-memory, the step unchanged) and the ready helpers (a warm-up schedule, gradient
accumulation right under DistributedDataParallel)."""

"""Several ranks: the launcher's process group, ranks searching in lockstep, DDP's buckets, FSDP
and ZeRO shards, and averaging gradients as DDP does."""

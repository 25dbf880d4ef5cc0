"""The torch edge, one room per concern: ``devices`` (memory, its cap and its allocator),
``steps`` (running a workload's steps, putting its state back, tracing), ``distributed`` (ranks
in lockstep, DDP, FSDP), ``data`` (DataLoaders and their timing) and ``workloads`` (what a trial
runs, and where it comes from)."""

"""Running a workload's steps: the trial runner and the step timer, the snapshot that puts model,
optimizer and RNG back, fake-tensor traces, compiled steps, techniques applied for a block, and
cutting a batch into micro-batches."""

"""The torch edge: devices and their memory, the storage tracker, running steps, tracing with
fake tensors, and putting the model, optimizer and RNG back."""

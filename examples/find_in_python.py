import torch
from torch import nn

import batchfit

model = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(32 * 32 * 32, 10))
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)


def make_batch(n):  # n samples, as the model and the loss take them
    return torch.randn(n, 3, 32, 32), torch.randint(0, 10, (n,))


def show(event: batchfit.Event) -> None:  # every verb reports its progress as Events
    if event.stage == "trial":
        print(f"{event.label} batch_size={event.batch_size}: {event.trial.outcome}")


workload = batchfit.Workload(model, optimizer, make_batch=make_batch, loss_fn=nn.functional.cross_entropy)
sizes = batchfit.BatchSizes(multiple_of=8)  # only multiples of 8
result = batchfit.find_batch_size(  # on a CPU standing in for a 128 MiB device
    workload, device="cpu", memory_limit="128MiB", memory_fraction=0.8, sizes=sizes, on_progress=show
)
print(result.batch_size, result.stop_reason)
print(result.summary())

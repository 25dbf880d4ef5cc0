"""Child process of test_compiled.py: the truth for a compiled step, read in a fresh process.

Usage: ``python compiled_child.py [--static BLOCKS] SIZE [SIZE ...]``. The allocator's running
total, which the profiler reports with each event, is kept by address in a table that outlives
each profiler session; a block allocated in one session and freed outside any leaves its entry
stale, and a free of that address later is reported with the stale size. So the truth is read
where no session ran before: here, in one session over every size. The compiled model first runs
at two sizes outside it, as ``find``'s opening trials do, so the sizes measured run Dynamo's
dynamic-shape graph, as ``find``'s later trials do; with ``--static``, the model of BLOCKS blocks
is compiled with ``dynamic=False`` and at each size before the session (a graph per size, as the
search compiles). Prints one JSON line: each size's peak over 2 SGD steps, in bytes.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from torch import nn
from torch._C._profiler import _EventType

#: A marker allocation's size: one more than the last size's, none a step allocates.
MARK = 1_000_003


def sgd_steps(model: nn.Module, optimizer: torch.optim.Optimizer, n: int) -> None:
    from compiled_workloads import make_batch

    for _ in range(2):
        inputs, targets = make_batch(n)
        nn.functional.cross_entropy(model(inputs), targets).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def main(sizes: list[int], static_blocks: int | None) -> None:
    from compiled_workloads import pointwise_model

    torch.manual_seed(0)
    model = pointwise_model() if static_blocks is None else pointwise_model(static_blocks)
    compiled = torch.compile(model, dynamic=False if static_blocks else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    # Compiled, then compiled again with a dynamic batch dimension; or a static graph per size.
    for n in (2, 4) if static_blocks is None else sizes:
        sgd_steps(compiled, optimizer, n)
    resident = sum(p.untyped_storage().nbytes() for p in model.parameters())
    marks = {MARK + i: n for i, n in enumerate(sizes)}
    activities = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=activities, profile_memory=True) as prof:
        for mark, n in marks.items():
            torch.empty(mark, dtype=torch.uint8)  # made and freed: its event marks where n begins
            sgd_steps(compiled, optimizer, n)
    events, pending = [], list(prof.profiler.kineto_results.experimental_event_tree())
    while pending:
        event = pending.pop()
        pending.extend(event.children)
        if event.tag == _EventType.Allocation and event.extra_fields.device.type == "cpu":
            fields = event.extra_fields
            events.append((event.start_time_ns, fields.alloc_size, fields.total_allocated))
    events.sort()
    peaks: dict[int, int] = {}
    current, base = None, 0
    for _, size, total in events:
        if size in marks:
            current, base = marks[size], total - size
        elif current is not None:
            peaks[current] = max(peaks.get(current, 0), resident + total - base)
    print(json.dumps({"peaks": peaks, "leftover": events[-1][2] - base}))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parents[2]))  # tests/, where the model is
    args = sys.argv[1:]
    static = int(args[1]) if args[:1] == ["--static"] else None
    main([int(arg) for arg in args[2 if static else 0 :]], static)

"""Child process of test_host_failure.py: a memory_limit on the CPU under a real RLIMIT_AS, a host
much smaller than the device the limit stands for.

Usage: ``python host_limit_child.py HEADROOM_MIB VERB ARGS...`` with VERB one of
``find MEMORY_LIMIT FRACTION MAX_BATCH``, ``check MEMORY_LIMIT BATCH_SIZE``, ``noise MEMORY_LIMIT
BATCH_SIZE MICRO_BATCH_SIZE`` (at memory_fraction=1) or ``cli ARGV...``
(``batchfit``'s command line, run in this process on ``host_limit_child:workload``). After torch
is imported and the model built, the address space is capped at the current VmSize +
HEADROOM_MIB, so the host's own allocator fails past it. Prints one JSON line: the answer, or the
error raised (type, message, attributes, what it was raised from), and the batch sizes tried.
"""

from __future__ import annotations

import contextlib
import io
import json
import resource
import sys
from typing import Any

import torch
from rlimit_child import Wide, make_batch, vm_size_bytes
from torch import nn

import batchfit
from batchfit.cli import main as cli_main

MiB = 2**20

torch.manual_seed(0)
model = Wide()
WORKLOAD = batchfit.Workload(
    model=model,
    optimizer=torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
    make_batch=make_batch,
    loss_fn=nn.functional.cross_entropy,
    name="wide",
)


def workload() -> batchfit.Workload:
    """The workload, for the command line's ``--workload host_limit_child:workload``."""
    return WORKLOAD


def run(verb: str, args: list[str], started: list[int]) -> dict[str, Any]:
    def heard(event: batchfit.Event) -> None:
        if event.stage == "started" and event.batch_size is not None:
            started.append(event.batch_size)

    if verb == "find":
        limit, fraction, largest = args[0], float(args[1]), int(args[2])
        sizes = batchfit.BatchSizes(max_batch_size=largest)
        result = batchfit.find_batch_size(
            WORKLOAD,
            device="cpu",
            memory_limit=limit,
            memory_fraction=fraction,
            sizes=sizes,
            on_progress=heard,
        )
        return {"batch_size": result.batch_size, "budget_bytes": result.budget_bytes}
    if verb == "noise":
        limit, batch, micro = args[0], int(args[1]), int(args[2])
        sampling = batchfit.Sampling(batch_size=batch, micro_batch_size=micro, steps=2)
        noise = batchfit.noise_scale(
            WORKLOAD, sampling=sampling, device="cpu", memory_limit=limit, memory_fraction=1.0
        )
        return {"steps": len(noise.readings)}
    if verb == "check":
        check = batchfit.check(WORKLOAD, int(args[1]), device="cpu", memory_limit=args[0], on_progress=heard)
        return {"fits": check.fits, "budget_bytes": check.budget_bytes, "peak_bytes": check.trial.peak_bytes}
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
        code = cli_main(args)
    return {"exit_code": code, "stderr": stderr.getvalue()}


def main() -> None:
    headroom, verb, args = int(sys.argv[1]) * MiB, sys.argv[2], sys.argv[3:]
    warm = torch.ones(2, requires_grad=True)  # autograd's engine starts before the cap
    (warm * 2).sum().backward()
    vm_before = vm_size_bytes()
    resource.setrlimit(resource.RLIMIT_AS, (vm_before + headroom, vm_before + headroom))
    started: list[int] = []
    report: dict[str, Any] = {
        "headroom": headroom,
        "parameter_bytes": sum(p.untyped_storage().nbytes() for p in model.parameters()),
        "started": started,
    }
    try:
        report["answer"] = run(verb, args, started)
    except Exception as error:
        report["error"] = {
            "type": type(error).__name__,
            "message": str(error),
            "memory_error": isinstance(error, MemoryError),
            "batchfit_error": isinstance(error, batchfit.BatchfitError),
            "attributes": {
                name: getattr(error, name)
                for name in ("batch_size", "budget_bytes", "host_bytes")
                if hasattr(error, name)
            },
            "cause": None if error.__cause__ is None else str(error.__cause__),
        }
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()

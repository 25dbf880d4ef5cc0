"""The process group a command joins when a launcher (torchrun) started it as one of several ranks:
read from the environment it sets (WORLD_SIZE, RANK, LOCAL_RANK, MASTER_ADDR, MASTER_PORT)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

import torch
import torch.distributed as dist

from batchfit import ConfigurationError, Where

#: What torchrun sets for every rank, and init_process_group's env:// reads.
LAUNCHER_VARIABLES = ("RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def launched_world_size() -> int:
    """The number of ranks a launcher started (1 when none did)."""
    text = os.environ.get("WORLD_SIZE", "1")
    try:
        world_size = int(text)
    except ValueError as error:
        raise ConfigurationError(f"WORLD_SIZE={text!r} is not a number of ranks.") from error
    if world_size < 1:
        raise ConfigurationError(f"WORLD_SIZE={world_size} must be 1 or more.")
    return world_size


@contextmanager
def launched_process_group(where: Where) -> Iterator[int | None]:
    """Join the launcher's process group for the block, and after it wait for every rank (the
    process then exits: ``exit_launched``); yields this rank, or None when the process runs alone.
    On CUDA every rank takes the GPU of its LOCAL_RANK (unless ``device`` names one) and the group
    uses NCCL; on the CPU it uses gloo. A group the caller initialised already is used as it is
    and left alone."""
    if dist.is_available() and dist.is_initialized():
        yield dist.get_rank() if dist.get_world_size() > 1 else None
        return
    if launched_world_size() == 1:
        yield None
        return
    missing = [name for name in LAUNCHER_VARIABLES if name not in os.environ]
    if missing:
        raise ConfigurationError(
            f"WORLD_SIZE={os.environ['WORLD_SIZE']} says this process is one of several ranks, but "
            f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not set. Launch it with "
            f"torchrun (torchrun --nproc_per_node=N -m batchfit ...), or unset WORLD_SIZE."
        )
    # CUDA named where none is present: gloo, and the command's own device check says so.
    named = None if where.device is None else torch.device(where.device)
    cuda = (named is None or named.type == "cuda") and torch.cuda.is_available()
    if cuda and (named is None or named.index is None):
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))  # "cuda" is then this rank's GPU
    dist.init_process_group("nccl" if cuda else "gloo")
    yield dist.get_rank()  # an error: every rank raises after the same collective, none waits
    # Leave together: a rank that tears gloo down while another still talks to it aborts. The group
    # is not destroyed, as the process exits next without C++ teardown (``exit_launched``): on
    # torch 2.4, destroy_process_group after a search sometimes never returns.
    dist.barrier()


def exit_launched(code: int) -> NoReturn:
    """End a process a launcher started, with ``code``, without the interpreter's C++ teardown: on
    torch 2.13's CPU build a process that used a gloo group sometimes aborts there ("terminate
    called without an active exception", after its work is done), which turns a finished job into
    a failed one."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)

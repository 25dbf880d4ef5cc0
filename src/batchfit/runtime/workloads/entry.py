"""What every verb checks of its arguments as it is called, before any work: a Workload (a model
is told how to wrap one), an ``on_progress`` function, and options objects of their kinds."""

from __future__ import annotations

import torch

from batchfit.checks import check_callback, check_option, shown, type_name
from batchfit.errors import ConfigurationError
from batchfit.runtime.workloads.workload import Workload


def check_workload(owner: str, workload: object) -> None:
    """A ConfigurationError where ``owner`` (a verb) is given something else than a Workload: what
    it was, and how to make a Workload of it."""
    if isinstance(workload, Workload):
        return
    got = f"{owner} expects a batchfit.Workload, got {type_name(workload)}"
    if isinstance(workload, torch.nn.Module):
        hint = "wrap it: batchfit.Workload(model, optimizer, make_batch=..., loss_fn=...)"
    elif isinstance(workload, str):
        hint = f"load it: batchfit.load_workload({workload!r})"
        got += f" ({shown(workload)})"
    else:
        hint = (
            "build one: batchfit.Workload(model, optimizer, make_batch=..., loss_fn=...), or load "
            "one: batchfit.load_workload('my_train:workload')"
        )
    raise ConfigurationError(f"{got}; {hint}.")


def check_entry(
    owner: str, workload: object, on_progress: object = None, **options: tuple[object, type]
) -> None:
    """A verb's arguments, checked as it is called: ``workload`` a Workload, ``on_progress`` a
    function or None, and each of ``options`` (``name=(value, kind)``) an options object of its kind."""
    check_workload(owner, workload)
    check_callback(f"{owner}'s on_progress", on_progress, "a batchfit.Event")
    for name, (value, kind) in options.items():
        check_option(owner, name, value, kind)

"""A workload from a spec: ``example:NAME`` (a built-in) or ``module:function`` (the user's); and
any function from a ``module:function`` spec (``--loader``)."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import os
import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from batchfit.errors import ConfigurationError
from batchfit.runtime.devices.resolve import parse_device
from batchfit.runtime.workloads.examples import build_example
from batchfit.runtime.workloads.workload import Workload


def load_workload(
    spec: str, *, device: str | torch.device | None = None, source: str = "workload"
) -> Workload:
    """Import ``module:function`` (the working directory is importable) and call it for a Workload.

    ``example:NAME`` is a built-in example, built on ``device`` and, among several ranks, wrapped
    in ``DistributedDataParallel`` as data-parallel training runs it (``example_as_trained``). A
    function with a ``device`` parameter is called with the device too
    (``function(device=torch.device(...))``), so the same workload serves every device; it wraps
    its model itself. ``source`` names where the spec came from, in errors.
    """
    if not isinstance(spec, str):
        made = getattr(spec, "__name__", "<lambda>")
        hint = "" if made == "<lambda>" else f" (workload = {made}())"
        hint = f"call it yourself{hint}, or pass" if callable(spec) else "pass"
        raise ConfigurationError(
            f"load_workload expects a spec 'module:function' or 'example:NAME' (a str), got "
            f"{type(spec).__name__}; {hint} a spec such as load_workload('my_train:workload')."
        )
    if spec.startswith("example:"):
        return example_as_trained(spec.partition(":")[2], device)
    function = load_function(spec, source)
    _check_callable_alone(function, spec, source)
    workload = function(device=parse_device(device)) if _takes_device(function) else function()
    if not isinstance(workload, Workload):
        raise ConfigurationError(
            f"{source} {spec!r} returned {type(workload).__name__}, not a batchfit.Workload."
        )
    return workload


def example_as_trained(name: str, device: str | torch.device | None) -> Workload:
    """The built-in example ``name`` on ``device``; under a process group of several ranks, its
    model wrapped in ``DistributedDataParallel`` (each rank's own GPU, or the CPU), whose gradient
    buckets a search then counts (``runtime.distributed.data_parallel``)."""
    workload = build_example(name, device)
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return workload
    on = next(workload.model.parameters()).device
    ids = [on.index] if on.type == "cuda" else None
    return dataclasses.replace(workload, model=DistributedDataParallel(workload.model, device_ids=ids))


def load_function(spec: str, source: str) -> Callable[..., Any]:
    """Import ``module:function`` (the working directory is importable); errors name ``source``."""
    module_name, _, function_name = spec.partition(":")
    if not module_name or not function_name:
        raise ConfigurationError(f"{source} {spec!r} must be MODULE:FUNCTION, e.g. my_train:workload.")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ConfigurationError(
            f"{source} {spec!r}: cannot import {module_name!r} ({error}); run batchfit from the "
            f"folder that holds it, or add that folder to PYTHONPATH."
        ) from error
    except Exception as error:  # the module's own code failed as it was imported
        raise ConfigurationError(
            f"{source} {spec!r}: importing {module_name!r} raised {type(error).__name__}: {error}"
            f"{_where_raised(error)}; fix the module so that `python -c 'import {module_name}'` runs."
        ) from error
    function = getattr(module, function_name, None)
    if not callable(function):
        raise ConfigurationError(f"{source} {spec!r}: {module_name} has no function {function_name!r}.")
    return function  # type: ignore[no-any-return]


def _where_raised(error: BaseException) -> str:
    """`` (at FILE:LINE)``, the innermost frame that raised ``error`` (a SyntaxError's own place)."""
    if isinstance(error, SyntaxError):
        return ""  # its message names the file and line
    frame = error.__traceback__
    while frame is not None and frame.tb_next is not None:
        frame = frame.tb_next
    return "" if frame is None else f" (at {frame.tb_frame.f_code.co_filename}:{frame.tb_lineno})"


def _check_callable_alone(function: Callable[..., Any], spec: str, source: str) -> None:
    """A ConfigurationError where ``function`` needs arguments batchfit cannot give (it gives
    ``device`` alone, where the function takes it)."""
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):  # a builtin without a signature: its call will say
        return
    try:
        signature.bind(**({"device": None} if "device" in signature.parameters else {}))
    except TypeError as error:
        call = f"{getattr(function, '__name__', spec)}({', '.join(signature.parameters)})"
        raise ConfigurationError(
            f"{source} {spec!r}: {call} cannot be called without arguments ({error}); "
            f"the function must take none (or device=) and return a batchfit.Workload."
        ) from error


def _takes_device(function: Callable[..., Any]) -> bool:
    try:
        return "device" in inspect.signature(function).parameters
    except (TypeError, ValueError):  # a builtin or an extension without a signature
        return False

"""Techniques applied to a workload without the user rewriting their step: mixed precision,
activation checkpointing, cuDNN's auto-tuner, CUDA's expandable segments, gradient accumulation.
Each is applied for a block and put back after it (the model's modules, the global cuDNN flag, the
allocator's setting)."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from batchfit.errors import ConfigurationError
from batchfit.policy.explore.techniques import ACCUMULATION, COMPILE, EXPANDABLE_SEGMENTS, mixed_precision_of
from batchfit.runtime.devices.allocator_settings import set_allocator_settings
from batchfit.runtime.workloads.default_step import model_loss, needs_closure, optimizer_step
from batchfit.runtime.workloads.workload import Workload


def module_blocks(model: nn.Module) -> list[tuple[str, bool]]:
    """Each submodule's type name, and whether it is a block (it has parameters and children)."""
    return [
        (
            type(module).__name__,
            any(True for _ in module.children()) and any(True for _ in module.parameters()),
        )
        for module in model.modules()
        if module is not model
    ]


def runs_bfloat16(device: torch.device) -> bool:
    """Whether ``device`` runs bfloat16: the CPU does, and GPUs from Ampere on (and ROCm's). A V100
    or T4 can hold bfloat16 tensors but only emulates their arithmetic: float16 is its precision."""
    if device.type != "cuda":
        return True
    with torch.cuda.device(device):
        try:
            return bool(torch.cuda.is_bf16_supported(including_emulation=False))
        except TypeError:  # torch before 2.4 has no emulation to count
            return bool(torch.cuda.is_bf16_supported())


def mixed_precision(device: torch.device, kind: str = "amp") -> tuple[torch.dtype, bool]:
    """The autocast dtype and whether it needs a GradScaler, for ``kind`` (``policy.explore.techniques``'
    ``MIXED_PRECISION``): float16 with a GradScaler for ``amp-fp16``, bfloat16 for ``amp-bf16``;
    for ``amp``, bfloat16 where ``device`` runs it, else float16 with a GradScaler."""
    if kind == "amp-fp16" or (kind == "amp" and not runs_bfloat16(device)):
        return torch.float16, True
    return torch.bfloat16, False


@contextmanager
def applied(
    workload: Workload,
    parts: tuple[str, ...],
    device: torch.device,
    *,
    block: str | None = None,
    accumulation_steps: int = 1,
) -> Iterator[tuple[Workload, str]]:
    """The workload with ``parts`` applied, and a line saying how; the model's modules and the
    cuDNN flag are put back when the block ends."""
    variant = dataclasses.replace(workload)
    notes = []
    with ExitStack() as undo:
        if "checkpointing" in parts:
            if block is None:
                raise ConfigurationError("checkpointing needs the type name of the block to wrap.")
            wrapped = _checkpoint_blocks(workload.module, block, undo)
            notes.append(f"checkpointing {wrapped} {block} block{'s' if wrapped != 1 else ''}")
        if COMPILE in parts:  # the model as the step calls it: checkpointed blocks are traced through
            compiled: Any = torch.compile(workload.module)  # an OptimizedModule, which torch types loosely
            variant = variant.replaced(model=compiled)  # a DDP's buckets still held beside it
            notes.append("torch.compile")
        amp = mixed_precision_of(parts)
        if amp is not None:
            dtype, scaled = mixed_precision(device, amp)
            variant.train_step = _autocast_step(workload, device, dtype, scaled)
            notes.append(
                f"autocast {str(dtype).removeprefix('torch.')}{' with a GradScaler' if scaled else ''}"
            )
        for part in parts:
            if part.startswith("cudnn-benchmark"):
                previous = torch.backends.cudnn.benchmark
                undo.callback(setattr, torch.backends.cudnn, "benchmark", previous)
                torch.backends.cudnn.benchmark = part.endswith("-on")
                notes.append(f"cudnn.benchmark={torch.backends.cudnn.benchmark}")
        if EXPANDABLE_SEGMENTS in parts:
            # New segments are expandable from here; what the workload holds stays where it is, in
            # the segments it was made in (CUDA's allocator serves both; the search then runs
            # without the allocator's replay, which models one kind at a time).
            undo.callback(set_allocator_settings, "expandable_segments:False")
            set_allocator_settings("expandable_segments:True")
            notes.append("expandable_segments:True")
        if ACCUMULATION in parts:
            variant.train_step = _accumulated_step(workload, accumulation_steps)
            notes.append(f"{accumulation_steps} accumulation steps per optimizer step")
        yield variant, ", ".join(notes) or "as given"


@functools.cache
def compiler_unavailable(device_type: str) -> str | None:
    """Why ``torch.compile`` cannot run on ``device_type`` here (Inductor needs a C++ compiler on
    the CPU, Triton on a GPU), None where it can: a small function compiled and run once."""
    try:
        torch.compile(lambda x: torch.sigmoid(x) * 2)(torch.ones(4, device=device_type))
    except Exception as error:  # BackendCompilerFailed and its kin
        first = (str(error).strip().splitlines() or [""])[0]
        return f"torch.compile does not run on {device_type} here ({type(error).__name__}: {first})"
    return None


def _checkpoint_blocks(model: nn.Module, block: str, undo: ExitStack) -> int:
    """Wrap every module of type ``block`` in activation checkpointing until ``undo`` closes."""
    found = [module for module in model.modules() if type(module).__name__ == block and module is not model]
    if not found:
        raise ConfigurationError(
            f"checkpoint_module={block!r}: the model has no module of that type; name one of "
            f"{sorted({type(module).__name__ for module in model.modules()})}."
        )
    for module in found:
        original = module.forward
        module.forward = functools.partial(_checkpointed, original)  # type: ignore[method-assign]
        undo.callback(delattr, module, "forward")  # the class's own forward again
    return len(found)


def _checkpointed(forward: Any, *args: Any, **kwargs: Any) -> Any:
    return checkpoint(forward, *args, use_reentrant=False, **kwargs)


def _autocast_step(workload: Workload, device: torch.device, dtype: torch.dtype, scaled: bool) -> Any:
    scaler = torch.amp.GradScaler(device.type) if scaled else None

    def step(model: nn.Module, optimizer: torch.optim.Optimizer | None, batch: Any) -> None:
        if optimizer is None:
            raise ConfigurationError("amp needs Workload.optimizer: it steps the optimizer itself.")

        def loss() -> torch.Tensor:
            with torch.autocast(device.type, dtype=dtype):
                return model_loss(model, batch, workload.loss_fn)

        if scaler is None:
            optimizer_step(optimizer, loss)
            return
        if needs_closure(optimizer):
            raise ConfigurationError(
                f"float16 mixed precision steps the optimizer through a GradScaler, which cannot "
                f"step {type(optimizer).__name__} (it needs a closure); use bfloat16 (amp-bf16) "
                f"or full precision with it."
            )
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss()).backward()
        scaler.step(optimizer)
        scaler.update()

    return step


def _accumulated_step(workload: Workload, accumulation_steps: int) -> Any:
    """``accumulation_steps`` forwards and backwards of the batch, then one optimizer step: the
    step of a micro-batch x accumulation run."""

    def step(model: nn.Module, optimizer: torch.optim.Optimizer | None, batch: Any) -> None:
        if optimizer is None:
            raise ConfigurationError("accumulation needs Workload.optimizer: it steps it once per batch.")
        optimizer_step(
            optimizer, lambda: model_loss(model, batch, workload.loss_fn), times=accumulation_steps
        )

    return step

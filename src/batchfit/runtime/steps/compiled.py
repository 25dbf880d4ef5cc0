"""Steps that run ``torch.compile``'d code, and how the CPU devices measure them.

Dynamo runs a frame eagerly while a ``TorchDispatchMode`` is active, and the CPU devices count
storages with one (``StorageTracker``). Measured that way, a compiled step is its eager twin, which
holds the intermediates the compiled kernels fuse away, so the answer would be a fraction of the
truth. A compiled step is measured instead from the CPU allocator's own events, which torch's
profiler takes down (``profile_memory``: each allocation and free, with its address and size). The
profiler cannot refuse an allocation, so the cap is judged on the events once the trial's steps
have run: the first allocation that takes the live bytes past the cap is where the step would have
failed, and the step's peak is what it held before it, as ``StorageTracker`` reports a refused
allocation; the trial then fails with that message. (Until the steps end, a batch past the budget
takes its memory from the host.)
"""

from __future__ import annotations

import os
import sys
import weakref
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from batchfit.errors import ConfigurationError
from batchfit.runtime.devices.tracker import dense_parts, oom_message
from batchfit.runtime.steps.reach import reachable_where

#: The graphs a search (or an exploration) may compile per frame past the user's own limit: a
#: batch size each, for a model compiled with ``dynamic=False``.
EXTRA_RECOMPILES = 64


def compiled_parts(*roots: Any) -> list[str]:
    """What in ``roots`` (a workload's model, steps and loss) runs ``torch.compile``'d code: a
    compiled module (``torch.compile(module)`` or ``module.compile()``), a module whose
    ``forward`` was compiled, or a compiled function, found as ``runtime.steps.reach.reachable`` finds
    a step's GradScaler (closures, partials, bound methods, defaults, named globals). Empty when
    Dynamo was never imported: nothing can have been compiled then."""
    if "torch._dynamo" not in sys.modules:
        return []
    found: list[str] = []
    for value in reachable_where(roots, _holds_compiled):
        if isinstance(value, torch.nn.Module):
            found.extend(
                f"{type(module).__name__} {name or '(the model)'}".rstrip()
                for name, module in value.named_modules()
                if _compiled_module(module)
            )
        else:
            found.append(f"function {getattr(value, '__qualname__', repr(value))}")
    return list(dict.fromkeys(found))


@contextmanager
def recompiles_allowed(compiled: bool) -> Iterator[None]:
    """A block in which Dynamo may compile ``EXTRA_RECOMPILES`` more graphs per frame than the user
    allows (its ``recompile_limit``, 8 by default), the limit put back after.

    Past the limit Dynamo runs a frame eagerly for any new shape, and a search tries many batch
    sizes: a model compiled with ``dynamic=False`` compiles at each, so from its ninth size on a
    search would measure the eager step, and an answer found there would be its eager twin's.
    """
    if not compiled:
        yield
        return
    from torch._dynamo import config  # imported already: something was compiled

    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    limit = getattr(config, name)
    setattr(config, name, limit + EXTRA_RECOMPILES)
    try:
        yield
    finally:
        setattr(config, name, limit)


def _holds_compiled(value: Any) -> bool:
    if isinstance(value, torch.nn.Module):
        return any(_compiled_module(module) for module in value.modules())
    return _compiled_function(value)


def _compiled_module(module: torch.nn.Module) -> bool:
    return (
        _compiled_function(module)  # OptimizedModule: torch.compile(module)
        or getattr(module, "_compiled_call_impl", None) is not None  # module.compile()
        or _compiled_function(module.__dict__.get("forward"))  # module.forward = torch.compile(...)
    )


def _compiled_function(value: Any) -> bool:
    # What Dynamo's wrappers carry (a compiled function, an OptimizedModule): the original callable.
    return value is not None and callable(value) and hasattr(value, "_torchdynamo_orig_callable")


class ProfiledAllocations:
    """The live bytes of a block, read from the CPU allocator's events, under a cap judged on them.

    One profiler runs over the whole block (on torch 2.13, stopping and starting one between
    steps corrupts the heap of the profiler's results). ``mark`` drops a one-byte marker allocation
    into the events where a step or an optimizer step begins or ends, so ``steps`` can cut them
    there afterwards. ``resident`` storages (and ``wrapper_bytes``, ``Workload.wrapper_bytes``)
    are counted from the start, the storages taken off where a weak reference sees them freed
    (the allocator reports no free of a block it allocated before the profiler ran); a free of
    any other block allocated before is not counted, as ``StorageTracker`` counts only what the
    block allocates.
    """

    def __init__(
        self, resident: Iterable[torch.Tensor], cap_bytes: int | None, wrapper_bytes: int = 0
    ) -> None:
        self.cap_bytes = cap_bytes
        self.resident_bytes = wrapper_bytes  # the model's wrapper's (DDP's buckets), held throughout
        self._refs: list[weakref.ref[torch.UntypedStorage]] = []
        self._freed: list[tuple[int, int]] = []  # (markers dropped before, bytes) per resident freed
        for storage in _storages(resident):
            self.resident_bytes += storage.nbytes()
            self._refs.append(weakref.ref(storage, self._on_free(storage.nbytes())))
        self._markers: list[tuple[str, torch.Tensor]] = []
        self._profiler: Any = None
        self._events: list[tuple[int, int]] = []

    def __enter__(self) -> ProfiledAllocations:
        if torch._C._autograd._profiler_enabled():  # a second session would end the first one's
            raise ConfigurationError(
                "batchfit measures a torch.compile'd step on the CPU with torch's profiler, and a "
                "profiler runs already: run the search outside your own profiler."
            )
        self._profiler = torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True
        )
        with _kineto_quiet():
            self._profiler.start()
        return self

    def __exit__(self, *exc: object) -> None:
        profiler, self._profiler = self._profiler, None
        with _kineto_quiet():
            profiler.stop()
        self._events = _allocations(profiler)

    def mark(self, kind: str) -> None:
        """Note that ``kind`` ("step", "enter", "exit") happens here in the allocator's events."""
        self._markers.append((kind, torch.empty(1, dtype=torch.uint8)))  # held: its address is its own

    def _on_free(self, nbytes: int) -> Callable[[object], None]:
        def freed(_: object) -> None:
            self._freed.append((len(self._markers), nbytes))

        return freed

    def steps(self) -> ProfiledSteps:
        """The block's steps, read from its events once it has exited."""
        at = {marker.data_ptr(): index for index, (_, marker) in enumerate(self._markers)}
        kinds = [kind for kind, _ in self._markers]
        freed = sorted(self._freed)
        steps = ProfiledSteps(self.cap_bytes, self.resident_bytes)
        held: dict[int, int] = {}  # address -> bytes, of the blocks allocated in the block
        seen = 0  # markers passed
        for address, nbytes in self._events:
            index = at.get(address) if nbytes == 1 else None
            if index is not None and index == seen:
                seen += 1
                while freed and freed[0][0] < seen:  # resident storages freed before this marker
                    steps.free(freed.pop(0)[1])
                steps.boundary(kinds[index])
            elif nbytes > 0:
                steps.free(held.pop(address, 0))  # an address handed out again was freed, if unreported
                held[address] = nbytes
                if not steps.allocate(nbytes):
                    break  # the step failed there: what it did after is not training's
            else:
                steps.free(held.pop(address, 0))
        self._markers.clear()
        return steps


class ProfiledSteps:
    """What a profiled block's events say, step by step: the live bytes, the last step's peaks
    within and outside its optimizer steps, and the first allocation past the cap (``refused``,
    with the step it came in) where one was."""

    def __init__(self, cap_bytes: int | None, live_bytes: int) -> None:
        self.cap_bytes = cap_bytes
        self.live_bytes = live_bytes
        self.step = 0  # steps begun
        self.in_optimizer = False
        self.activation_peak_bytes: int | None = None
        self.optimizer_peak_bytes: int | None = None
        self.refused = ""
        self._phase_peak = live_bytes

    def boundary(self, kind: str) -> None:
        if kind == "step":
            self.step += 1
            self.activation_peak_bytes = self.optimizer_peak_bytes = None
            self._phase_peak = self.live_bytes
            self.in_optimizer = False
            return
        self.close_phase()
        self.in_optimizer = kind == "enter"

    def close_phase(self) -> None:
        if self.in_optimizer:
            self.optimizer_peak_bytes = max(self.optimizer_peak_bytes or 0, self._phase_peak)
        else:
            self.activation_peak_bytes = max(self.activation_peak_bytes or 0, self._phase_peak)
        self._phase_peak = self.live_bytes

    def allocate(self, nbytes: int) -> bool:
        """Count an allocation; False (and ``refused`` set) where it would pass the cap."""
        if self.cap_bytes is not None and self.live_bytes + nbytes > self.cap_bytes:
            self.refused = oom_message(nbytes, self.live_bytes, self.cap_bytes)
            return False
        self.live_bytes += nbytes
        self._phase_peak = max(self._phase_peak, self.live_bytes)
        return True

    def free(self, nbytes: int) -> None:
        self.live_bytes -= nbytes


@contextmanager
def _kineto_quiet() -> Iterator[None]:
    """The profiler's start or stop with the process's stderr closed: libkineto writes a line to it at
    each ("USDT: ... profiler_start"), two per trial, whatever its log level. Nothing else runs then."""
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no stderr to quiet
        yield
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    os.close(devnull)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _storages(tensors: Iterable[torch.Tensor]) -> Iterator[torch.UntypedStorage]:
    seen: set[int] = set()
    for tensor in tensors:
        for part in dense_parts(tensor) if tensor.device.type == "cpu" else ():
            storage = part.untyped_storage()
            if storage._cdata not in seen and storage.nbytes():
                seen.add(storage._cdata)
                yield storage


def _allocations(profiler: Any) -> list[tuple[int, int]]:
    """The CPU allocator's events the profiler took down, in the order they happened: (address,
    bytes), the bytes negative for a free."""
    from torch._C._profiler import _EventType  # torch's own profiler types, read as its memory profiler does

    events = []
    pending = list(profiler.profiler.kineto_results.experimental_event_tree())
    while pending:
        event = pending.pop()
        pending.extend(event.children)
        if event.tag == _EventType.Allocation:
            fields = event.extra_fields
            if fields.device.type == "cpu":
                events.append((event.start_time_ns, fields.ptr, fields.alloc_size))
    events.sort(key=lambda event: event[0])
    return [(address, nbytes) for _, address, nbytes in events]

"""Live tensor-storage accounting on the CPU, and an optional capacity enforced on it.

A ``TorchDispatchMode`` sees every aten op's outputs; each new storage is counted once, and a
weak reference on it takes its bytes back off when it is freed. A storage made outside the
dispatcher (a collective's buffer) counts when an op first shows it; where the tracker noted the
storages alive when it began (``note_existing``), a view of one of them costs nothing. The peak is
exact to the byte. With a capacity, an op whose new storages would take live bytes past
it raises ``torch.OutOfMemoryError`` at that op, as a GPU allocator would.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass

from batchfit.runtime.devices.oom import CAP_MARK
from batchfit.units import format_bytes


def dense_parts(tensor: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The strided tensors that hold ``tensor``'s data, each with a storage: the tensor itself, a
    sparse tensor's indices and values (an ``nn.Embedding(sparse=True)``'s gradient), or a jagged
    nested tensor's values and offsets (and lengths), or the tensors a wrapper subclass holds (a
    ``DTensor``'s local shard, not the global size its wrapper reports)."""
    layout = tensor.layout
    if layout != torch.jagged and is_traceable_wrapper_subclass(tensor):
        names, _ = tensor.__tensor_flatten__()  # the inner tensors' names (a DTensor's mesh too)
        inner = (getattr(tensor, name) for name in names)
        return tuple(part for each in inner if isinstance(each, torch.Tensor) for part in dense_parts(each))
    if layout == torch.jagged:
        nested: Any = tensor  # torch's NestedTensor, whose class torch keeps private
        lengths = nested.lengths()
        return (nested.values(), nested.offsets(), *(() if lengths is None else (lengths,)))
    if layout == torch.sparse_coo:
        return (tensor._indices(), tensor._values())
    if layout in (torch.sparse_csr, torch.sparse_bsr):
        return (tensor.crow_indices(), tensor.col_indices(), tensor.values())
    if layout in (torch.sparse_csc, torch.sparse_bsc):
        return (tensor.ccol_indices(), tensor.row_indices(), tensor.values())
    return (tensor,)  # strided, nested strided and the rest: the storage the tensor names


def resident_tensors(*objects: Any) -> Iterator[torch.Tensor]:
    """Tensors held by modules (parameters, gradients, buffers), optimizers (state) or given as is;
    a sparse one as its dense parts (``dense_parts``)."""
    for obj in objects:
        if obj is None:
            continue
        if isinstance(obj, torch.Tensor):
            yield from dense_parts(obj)
        elif isinstance(obj, torch.nn.Module):
            for parameter in obj.parameters():
                yield from dense_parts(parameter)
                if parameter.grad is not None:
                    yield from dense_parts(parameter.grad)
            for buffer in obj.buffers():
                yield from dense_parts(buffer)
        elif isinstance(obj, torch.optim.Optimizer):
            for each in wrapped_optimizers(obj):
                for state in each.state.values():  # tensors, and lists of them (L-BFGS's history)
                    yield from resident_tensors(*state.values())
        elif isinstance(obj, (list, tuple, set)):
            yield from resident_tensors(*obj)
        elif isinstance(obj, dict):
            yield from resident_tensors(*obj.values())


def wrapped_optimizers(optimizer: torch.optim.Optimizer) -> list[torch.optim.Optimizer]:
    """``optimizer`` and the optimizers it holds as attributes, whose state may be its own:
    ``ZeroRedundancyOptimizer``'s local optimizer over this rank's shard, the optimizer inside
    accelerate's or Lightning's wrapper (whose state is the wrapped one's: the same dict)."""
    found = [optimizer]
    for value in vars(optimizer).values():
        if isinstance(value, torch.optim.Optimizer) and all(value is not each for each in found):
            found.append(value)
    return found


class StorageTracker(TorchDispatchMode):
    """Counts the bytes of live storages on ``device_type``; enforces ``capacity_bytes`` if given."""

    def __init__(
        self, capacity_bytes: int | None = None, device_type: str = "cpu", fake: bool = False
    ) -> None:
        super().__init__()
        self.capacity_bytes = capacity_bytes
        self.device_type = device_type
        self.fake = fake  # count fake tensors (a trace) instead of real ones
        self.live_bytes = 0
        self.peak_bytes = 0
        self.refused = ""  # the message of the last allocation the capacity refused
        self._sizes: dict[int, int] = {}  # storage key -> bytes counted for it
        self._refs: dict[int, weakref.ref[torch.UntypedStorage]] = {}
        # Storages alive when the block began, and their bytes then (``note_existing``).
        self._existing: dict[int, int] = {}
        self._existing_refs: list[weakref.ref[torch.UntypedStorage]] = []

    def note_existing(self) -> None:
        """Note every storage alive now that the tracker would count: a view of one made in the
        block costs nothing, as a GPU allocates nothing for a view (a dataset's row), while one
        made later, or grown since, counts when an op shows it. Walks the garbage collector's
        objects: for a block run once (``batchfit.cap_memory``), not for every trial."""
        for obj in gc.get_objects():  # type(), not isinstance: a proxy's __class__ may warn
            if issubclass(type(obj), torch.Tensor) and self._counts(obj):
                for part in dense_parts(obj):
                    storage = part.untyped_storage()
                    key = storage._cdata
                    if key not in self._existing:
                        self._existing[key] = storage.nbytes()
                        self._existing_refs.append(weakref.ref(storage, self._forget(key)))

    def _forget(self, key: int) -> Any:
        def forget(_: object) -> None:
            self._existing.pop(key, None)

        return forget

    def track(self, tensors: Iterable[torch.Tensor]) -> None:
        """Count storages that already exist (a model's parameters, optimizer state...)."""
        for tensor in tensors:
            for part in dense_parts(tensor) if self._counts(tensor) else ():
                self._add(part.untyped_storage(), self._new_bytes(part.untyped_storage()))
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)

    def hold(self, nbytes: int) -> None:
        """Count ``nbytes`` held on the device outside any tensor the tracker is shown (DDP's
        gradient buckets), for as long as the tracker counts."""
        self.live_bytes += nbytes
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)

    def reset_peak(self) -> None:
        self.peak_bytes = self.live_bytes

    def _new_bytes(self, storage: torch.UntypedStorage) -> int:
        """Bytes this storage adds to the live total (0 when already counted at its size)."""
        return storage.nbytes() - self._sizes.get(storage._cdata, 0)

    def _add(self, storage: torch.UntypedStorage, added: int) -> None:
        key = storage._cdata
        if key not in self._refs:
            self._refs[key] = weakref.ref(storage, self._on_free(key))
        self._sizes[key] = self._sizes.get(key, 0) + added
        self.live_bytes += added

    def _on_free(self, key: int) -> Any:
        def release(_: object) -> None:
            self.live_bytes -= self._sizes.pop(key, 0)
            self._refs.pop(key, None)

        return release

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        storages = output_storages(out, self.device_type, self.fake)
        if func.is_view and self._existing:  # a view of a storage alive before the block: free
            storages = {key: each for key, each in storages.items() if not self._older(key, each)}
        added = {key: self._new_bytes(storage) for key, storage in storages.items()}
        requested = sum(added.values())
        if (
            self.capacity_bytes is not None
            and requested > 0
            and self.live_bytes + requested > self.capacity_bytes
        ):
            del out, storages
            self.refused = oom_message(requested, self.live_bytes, self.capacity_bytes)
            raise torch.OutOfMemoryError(self.refused)
        for key, storage in storages.items():
            if added[key]:
                self._add(storage, added[key])
        if self.live_bytes > self.peak_bytes:
            self.peak_bytes = self.live_bytes
        return out

    def _older(self, key: int, storage: torch.UntypedStorage) -> bool:
        """Whether ``storage`` is one alive when the block began, uncounted and no larger."""
        return key not in self._sizes and storage.nbytes() <= self._existing.get(key, -1)

    def _counts(self, tensor: torch.Tensor) -> bool:
        return counted(tensor, self.device_type, self.fake)


def counted(tensor: torch.Tensor, device_type: str, fake: bool = False) -> bool:
    """Whether a tracker of ``device_type`` counts ``tensor``: the tensor's device decides, not its
    storage's (a fake tensor's storage is on "meta"), and a trace counts fake tensors alone."""
    return tensor.device.type == device_type and isinstance(tensor, FakeTensor) == fake


def output_storages(value: Any, device_type: str, fake: bool = False) -> dict[int, torch.UntypedStorage]:
    """The storages of the tensors in an op's output (a tensor, or tuples and lists of them) that a
    tracker of ``device_type`` counts, by key, in order (a sparse tensor's indices and values).
    NotImplementedError for a sparse output of a trace (``fake``): its size is the data's."""
    found: dict[int, torch.UntypedStorage] = {}
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, torch.Tensor):
            if fake and item.layout != torch.strided:
                # How many values a sparse (or jagged) tensor holds depends on the data, which a fake
                # tensor lacks (a sparse clone says 0): the trace cannot count them, real trials do.
                raise NotImplementedError(f"a fake tensor cannot size a {item.layout} tensor's values")
            for part in dense_parts(item) if counted(item, device_type, fake) else ():
                storage = part.untyped_storage()
                found[storage._cdata] = storage
        elif isinstance(item, (tuple, list)):
            pending.extend(reversed(item))
    return found


def resident_oom_message(resident: int, capacity: int) -> str:
    """The failure when the tensors a block starts with are already past the cap."""
    return (
        f"out of memory: DefaultCPUAllocator: can't allocate memory: the tensors already held "
        f"(parameters, gradients, optimizer state) take {resident} bytes ({format_bytes(resident)}), "
        f"over the limit of {capacity} bytes ({format_bytes(capacity)}) {CAP_MARK}."
    )


def oom_message(requested: int, live: int, capacity: int) -> str:
    # Follows PyTorch's CPU allocator message, so tools that match on it recognise this failure.
    return (
        f"out of memory: DefaultCPUAllocator: can't allocate memory: you tried to allocate "
        f"{requested} bytes ({format_bytes(requested)}) with {live} bytes ({format_bytes(live)}) "
        f"in use and a limit of {capacity} bytes ({format_bytes(capacity)}) {CAP_MARK}."
    )

"""The storage tracker and the standalone memory cap, on real tensors."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import batchfit
from batchfit.runtime.devices.oom import is_out_of_memory
from batchfit.runtime.devices.tracker import StorageTracker, dense_parts, resident_tensors


def test_counts_new_storages_once_and_releases_them() -> None:
    with StorageTracker() as tracker:
        a = torch.empty(1000)  # 4000 bytes
        view = a[10:20].view(2, 5)  # a view: no new storage
        b = a * 2  # 4000 more
        assert tracker.live_bytes == 8000 and view.numel() == 10
        del b
        assert tracker.live_bytes == 4000
        c = torch.empty(250, dtype=torch.float64)  # 2000
        del a, view
        assert tracker.live_bytes == 2000
    assert tracker.peak_bytes == 8000 and c.numel() == 250


def test_resize_is_counted() -> None:
    with StorageTracker() as tracker:
        a = torch.empty(10)
        a.resize_(1000)
        assert tracker.live_bytes == 4000


def test_peak_inside_a_training_step_is_exact() -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(100, 50)
    with StorageTracker() as tracker:
        tracker.track(model.parameters())
        params = (100 * 50 + 50) * 4
        assert tracker.live_bytes == params
        model(torch.randn(8, 100)).sum().backward()
    # Parameters + gradients stay; activations were freed.
    assert tracker.live_bytes == 2 * params
    assert tracker.peak_bytes >= 2 * params + 8 * 50 * 4


def test_cap_memory_raises_a_recognisable_out_of_memory() -> None:
    with pytest.raises(torch.OutOfMemoryError) as info, batchfit.cap_memory("1MiB"):
        keep = torch.empty(200_000)  # 800,000 bytes: fits
        torch.empty(100_000)  # 400,000 more: over 1 MiB
    message = str(info.value)
    assert "out of memory" in message and "DefaultCPUAllocator: can't allocate memory" in message
    assert "you tried to allocate 400000 bytes" in message and "a limit of 1048576 bytes" in message
    assert is_out_of_memory(info.value)
    assert isinstance(info.value, RuntimeError) and len(info.value.args) == 1
    del keep


def test_cap_memory_counts_resident_objects() -> None:
    model = torch.nn.Linear(256, 256)  # 263,168 bytes of parameters
    with batchfit.cap_memory(300_000, resident=[model]) as tracker:
        torch.empty(5_000)  # 20,000 bytes: fits beside the model
        with pytest.raises(torch.OutOfMemoryError):
            torch.empty(10_000)
    assert tracker.peak_bytes == 263_168 + 20_000


def test_cap_memory_rejects_resident_state_over_the_limit() -> None:
    with (
        pytest.raises(torch.OutOfMemoryError),
        batchfit.cap_memory("100KiB", resident=[torch.empty(50_000)]),
    ):
        pass


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")
def test_a_sparse_tensor_counts_its_indices_and_values() -> None:
    # An nn.Embedding(sparse=True)'s gradient is a sparse COO tensor: its storages are its indices'
    # (int64, one row per entry) and its values' (one embedding row per looked-up index).
    embedding = torch.nn.Embedding(1000, 16, sparse=True)
    with StorageTracker() as tracker:
        embedding(torch.arange(40).view(4, 10)).sum().backward()
        grad = embedding.weight.grad
        assert grad is not None and grad.layout == torch.sparse_coo
        indices, values = dense_parts(grad)
        assert (
            indices.untyped_storage().nbytes() == 40 * 8 and values.untyped_storage().nbytes() == 40 * 16 * 4
        )
        assert tracker.live_bytes >= 40 * 8 + 40 * 16 * 4
    resident = list(resident_tensors(embedding))  # the weight, and the gradient's two parts
    assert [tuple(t.shape) for t in resident] == [(1000, 16), (1, 40), (40, 16)]
    csr = torch.eye(3).to_sparse_csr()
    assert [tuple(t.shape) for t in dense_parts(csr)] == [(4,), (3,), (3,)]


def test_a_jagged_nested_tensor_counts_its_values_and_offsets() -> None:
    with StorageTracker() as tracker:
        rows = torch.nested.nested_tensor([torch.randn(30, 4), torch.randn(50, 4)], layout=torch.jagged)
        held = tracker.live_bytes  # the components and what building them left alive
        doubled = rows * 2  # new values (80 x 4 floats); the offsets are shared
        assert tracker.live_bytes - held == 80 * 4 * 4
        assert [tuple(part.shape) for part in dense_parts(doubled)] == [(80, 4), (3,)]


def test_a_wrapper_subclass_counts_the_tensors_it_holds_not_the_size_it_reports() -> None:
    # A wrapper subclass (DTensor, FSDP2's sharded parameters) reports a size of its own, and its
    # wrapper's storage says so, while its bytes are those of the tensors inside (a DTensor's local
    # shard). torch's TwoTensor reports one tensor's size and holds two.
    from torch.testing._internal.two_tensor import TwoTensor

    pair = TwoTensor(torch.zeros(1000), torch.ones(1000))
    assert pair.untyped_storage().nbytes() == 4000
    assert [tuple(part.shape) for part in dense_parts(pair)] == [(1000,), (1000,)]
    tracker = StorageTracker()
    tracker.track(resident_tensors(pair))
    assert tracker.live_bytes == 8000
    with StorageTracker() as tracker:
        doubled = pair * 2  # the op makes both inner tensors anew
        assert tracker.live_bytes == 8000
    del doubled


def test_a_trace_refuses_a_sparse_tensor_it_cannot_size() -> None:
    # On fake tensors a sparse tensor's number of values is unknown (a clone says 0): the trace
    # stops, and real trials measure it.
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        embedding = torch.nn.Embedding(1000, 16, sparse=True)
        indices = torch.arange(40).view(4, 10)
        with (
            pytest.raises(NotImplementedError, match=r"cannot size a torch\.sparse_coo"),
            StorageTracker(fake=True),
        ):
            embedding(indices).sum().backward()


#: A tensor made before the block: 1024 rows of 1024 float32, 4 MiB.
def four_mib() -> torch.Tensor:
    return torch.arange(1024 * 1024, dtype=torch.float32).view(1024, 1024)


@pytest.mark.parametrize(
    ("take", "cost_bytes"),
    [
        pytest.param(lambda big, data: big[3], 0, id="a row"),
        pytest.param(lambda big, data: big[10:20], 0, id="a slice"),
        pytest.param(lambda big, data: big.view(-1)[:5].reshape(5, 1), 0, id="views of views"),
        pytest.param(lambda big, data: data[7], 0, id="a TensorDataset item"),
        pytest.param(lambda big, data: data[100:164], 0, id="a TensorDataset slice"),
        # ``to`` may return a view (nothing to change) or a copy: the copy is a new storage.
        pytest.param(lambda big, data: big.to(torch.float32), 0, id="to its own dtype"),
        pytest.param(lambda big, data: big[:2].to(torch.float64), 2 * 8192, id="two rows to float64"),
        pytest.param(lambda big, data: big[3].clone(), 4096, id="a clone of a row"),
        # The index list becomes a tensor in the block (16 bytes), as it is copied to a GPU.
        pytest.param(lambda big, data: big[[1, 2]], 8192 + 16, id="an indexed copy of two rows"),
        pytest.param(lambda big, data: torch.stack([data[0][0], data[1][0]]), 8192, id="a collated pair"),
        # Writing into a storage made before the block counts it from then on (DDP's buckets).
        pytest.param(lambda big, data: big[0].add_(1), 4 * 2**20, id="an in-place write"),
    ],
)
def test_cap_memory_counts_what_a_gpu_would_allocate(take: Any, cost_bytes: int) -> None:
    big = four_mib()
    data = torch.utils.data.TensorDataset(big, torch.arange(1024))
    with batchfit.cap_memory("1GiB") as measurement:
        kept = take(big, data)
    assert measurement.peak_bytes == cost_bytes
    del kept


def test_a_row_of_a_tensor_made_before_the_block_fits_a_limit_smaller_than_the_tensor() -> None:
    big = four_mib()
    with batchfit.cap_memory("1MiB") as measurement:
        row = big[5]
        batch = torch.utils.data.TensorDataset(big)[:64][0]
        assert torch.equal(row, torch.arange(5 * 1024, 6 * 1024, dtype=torch.float32))
        with pytest.raises(torch.OutOfMemoryError) as info:
            batch.clone()  # 64 rows: 256 KiB, fits
            big[:300].clone()  # 300 rows: 1.17 MiB, does not
    assert str(info.value) == (
        "out of memory: DefaultCPUAllocator: can't allocate memory: you tried to allocate 1228800 "
        "bytes (1.17 MiB) with 0 bytes (0 B) in use and a limit of 1048576 bytes (1.00 MiB) set by batchfit."
    )
    assert measurement.peak_bytes == 64 * 4096


def test_a_copy_that_to_makes_of_an_inference_tensor_counts_and_the_input_it_returns_does_not() -> None:
    # Under inference mode ``to`` reaches the tracker whole (``aten.to``, which may return its input,
    # so torch calls it a view), where elsewhere it is ``_to_copy``: as Lightning's validation loop
    # hands a batch to the device. A copy is a new storage all the same.
    with torch.inference_mode():
        big = four_mib()
        with batchfit.cap_memory("1GiB") as measurement:
            same = big.to("cpu")
            copy = big[:2].to("cpu", copy=True)
            assert copy.untyped_storage().data_ptr() != big.untyped_storage().data_ptr()
    assert measurement.peak_bytes == 8192
    del same, copy


def test_find_answers_the_same_on_a_dataset_whose_items_are_views_as_on_copies() -> None:
    # A TensorDataset's items are views of its 1 MiB + 32 KiB of tensors, made before the search;
    # the answer on a 1 MiB device is the one found on the same samples made apart (copies).
    torch.manual_seed(0)
    features, labels = torch.randn(4096, 64), torch.randint(0, 10, (4096,))
    sources: dict[str, dict[str, Any]] = {
        "views": {"dataset": torch.utils.data.TensorDataset(features, labels)},
        "copies": {"make_batch": lambda n: (features[:n].clone(), labels[:n].clone())},
    }
    answers = {}
    for name, source in sources.items():
        model = torch.nn.Linear(64, 10)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        workload = batchfit.Workload(model, optimizer, loss_fn=torch.nn.functional.cross_entropy, **source)
        sizes = batchfit.BatchSizes(max_batch_size=4096)
        answers[name] = batchfit.find_batch_size(
            workload, device="cpu", memory_limit="1MiB", sizes=sizes
        ).batch_size
    assert answers["views"] == answers["copies"] > 1000

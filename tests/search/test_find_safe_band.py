"""``find`` behind a caching allocator, where which sizes fit is not monotone: the answer holds every
smaller batch the run may see (``policy.search.safe_band``), on the CPU standing in for a GPU with CUDA's
allocator modelled, whose real trials are the truth."""

from __future__ import annotations

import pytest
from tiny_workloads import segment_crossing

from batchfit import BatchSizes, DoesNotFitError
from batchfit.runtime.devices.caching_device import CachingCpuDevice
from batchfit.search.find_batch_size import find_on
from batchfit.where import ResolvedDevice

CAP = 60 * 2**20  # 2,049-2,559 fail under it; 2,048 and 2,560-3,072 fit


def _find(sizes: BatchSizes = BatchSizes(max_batch_size=8192), dataset: bool = False):  # type: ignore[no-untyped-def]
    return find_on(ResolvedDevice(CachingCpuDevice(CAP), 1.0), segment_crossing(dataset), "train", sizes)


def test_the_answer_is_the_top_of_the_band_that_holds_every_smaller_batch() -> None:
    # The replay of the opening's requests places 3,072 but fails 2,049-2,559 below it: the search
    # aims at the band that holds every smaller batch, and the replay's larger size is reported
    # beside it, with what it risks and what makes it safe.
    result = _find()
    assert [(trial.batch_size, trial.outcome) for trial in result.trials] == [
        (2, "ok"),
        (4, "ok"),
        (2048, "ok"),  # the top of the band, over the confirming steps
        (2049, "oom"),
    ]
    assert result.batch_size == 2048 and result.stop_reason == "boundary"
    band = result.band
    assert band is not None and band.whole and (band.low, band.high, band.isolated) == (1, 2048, 3072)
    assert band.failing == ((2049, 2559),) and band.confirmed_at == () and band.isolated_by_replay
    assert band.memory_fraction_for_isolated is None  # the whole device is the cap already
    said = (
        "The replay places batch 3072 too (no trial ran it), but 2049-2559 below it fail: every batch "
        "from 1 to 2048 fits"
    )
    assert said in result.summary()
    assert (
        "drop the last batch (drop_last=True) or pad it to 3072, and pass must_fit_from=3072."
        in result.summary()
    )
    # The truth, by real trials from a fresh device: a size in the failing band, and two above it.
    assert [_fits(size) for size in (2300, 2560, 3072)] == [False, True, True]


def _fits(size: int) -> bool:
    try:
        _find(BatchSizes(size, size))
    except DoesNotFitError:
        return False
    return True


def test_a_run_that_never_sees_the_failing_sizes_keeps_the_larger_answer() -> None:
    alone = _find(BatchSizes(max_batch_size=8192, must_fit_from=3072))
    assert alone.batch_size == 3072 and alone.stop_reason == "boundary"
    assert alone.band is not None and alone.band.isolated is None and alone.band.low == 3072
    assert [trial.batch_size for trial in alone.trials] == [2, 4, 3072, 3073]


@pytest.mark.parametrize("dataset", [False, True], ids=["make_batch", "dataset"])
def test_a_dataset_s_last_batch_can_be_any_size(dataset: bool) -> None:
    # From a dataset (drop_last off by default in a DataLoader) the last batch of an epoch can be
    # any size below the answer: the band starts at 1 whatever min_batch_size says. No size from
    # 2,560 lies below the failures: the answer stays, with the risk and what makes it safe.
    result = _find(BatchSizes(min_batch_size=2560, max_batch_size=8192), dataset=dataset)
    assert result.batch_size == 3072 and result.band is not None
    assert result.band.low == (1 if dataset else 2560) and result.band.high == (None if dataset else 3072)
    assert result.band.isolated == (3072 if dataset else None)
    said = (
        "Batch 3072 fits, but 2049-2559 below it fail: no size the search may answer lies from 1 below 2049"
    )
    assert (said in result.summary()) == dataset

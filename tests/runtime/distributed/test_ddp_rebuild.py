"""A model in DDP searched behind CUDA's caching allocator (modelled on the CPU), on 2 real gloo
ranks: the trials rebuild DDP's buckets in step 2 as a fresh DDP does, so the answer trains a fresh
DDP and the next size does not (marker ``distributed``)."""

from __future__ import annotations

import json
from typing import Any

import ddp_rebuild_workers as workers
import pytest
from two_ranks import run_ranks

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    tmp_path = tmp_path_factory.mktemp("ddp-rebuild")
    run_ranks(workers.main, (str(tmp_path / "store"), str(tmp_path)), "the DDP rebuild search")
    return [json.loads((tmp_path / f"{rank}.json").read_text()) for rank in range(2)]


def test_the_answer_for_a_model_in_ddp_trains_a_fresh_ddp_and_the_next_size_does_not(
    reports: list[dict[str, Any]],
) -> None:
    # A fresh DDP frees its one bucket and allocates 3 in its second forward, into the blocks the
    # allocator caches then; the trials do the same. The search places the answer and the next
    # size from the replay of its opening's requests (which holds the rebuild too).
    assert all("error" not in report for report in reports), reports
    first, second = reports
    assert first["batch_size"] == second["batch_size"] and first["trials"] == second["trials"]
    assert first["trials"] == [2, 4, first["batch_size"], first["batch_size"] + 1]
    assert first["by_force"] == [True, False]


def test_holding_the_buckets_bytes_throughout_is_not_what_a_fresh_ddp_does(
    reports: list[dict[str, Any]],
) -> None:
    # Above the answer, the module beside one block of the buckets' bytes (what the trials held
    # before they rebuilt the buckets) trains; a fresh DDP runs out of memory in its step 2.
    assert reports[0]["batch_size"] < workers.HELD_FITS
    assert reports[0]["above"] == [True, False]


def test_the_trials_rebuild_the_buckets_ddp_rebuilds_and_the_result_says_so(
    reports: list[dict[str, Any]],
) -> None:
    report = reports[0]
    # DDP's own account of what it rebuilt into, after its second step: a bucket of the last two
    # layers (the first closes past 1 MiB), one of the middle two (past 25 MiB), and the first layer.
    assert report["ddp_rebuilt"] == [16778664, 34078848, 17301504]
    assert report["rebuilt_buckets"] == report["ddp_rebuilt"]
    held = ", DDP's gradient buckets of 65.00 MiB held and rebuilt into 3 buckets in step 2, as DDP does"
    assert held in report["summary"]
    assert report["has_rebuilt_after"] is False  # the user's DDP was not trained by the search

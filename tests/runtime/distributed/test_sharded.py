"""A model sharded by FSDP2 (``fully_shard``) and an optimizer sharded by ZeRO, searched by 2 real
gloo ranks on capped CPUs (marker ``distributed``)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import sharded_workers
import torch
from two_ranks import run_ranks

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    folder = tmp_path_factory.mktemp("fsdp")
    run_ranks(
        sharded_workers.main, (str(folder / "store"), "16MiB", str(folder)), "the FSDP and ZeRO searches"
    )
    reports = [json.loads((folder / f"{rank}.json").read_text()) for rank in range(2)]
    assert all("error" not in report for report in reports), reports
    return reports


@pytest.fixture(scope="module")
def fsdp(reports: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each rank's report of the FSDP2 searches, where this torch runs ``fully_shard`` on the CPU."""
    if not sharded_workers.FULLY_SHARD:
        pytest.skip(f"torch {torch.__version__}: FSDP2's fully_shard runs on the CPU from torch 2.7")
    return [report["fsdp"] for report in reports]


def test_a_sharded_model_s_answer_is_what_it_trains_with_after_trials_that_ran_out_of_memory(
    fsdp: list[dict[str, Any]],
) -> None:
    # A trial that runs out of memory stops midway through FSDP's forward or backward, its gathered
    # parameters registered; the next trial starts from the sharded state all the same (before,
    # it ran its layers on the shards and raised). The answer trains by force, 2 steps with FSDP's
    # all-gathers and reduce-scatters, on every rank; the next size does not.
    first, second = fsdp
    assert first["trials"] == second["trials"]
    outcomes = [outcome for _, outcome in first["trials"]]
    assert "oom" in outcomes[:-1] and "ok" in outcomes[outcomes.index("oom") :]
    assert first["by_force"] == [True, False]


def test_a_torch_without_reset_iter_state_searches_a_sharded_model_all_the_same(
    fsdp: list[dict[str, Any]],
) -> None:
    # torch 2.13 resets FSDP2 after a step that raised (reset_iter_state); before it (2.11, on our
    # GPU machines), re-registering the shards left FSDP's iteration state mid-step, and the trial
    # after the second out-of-memory raised "got mixed torch.Tensor and DTensor". batchfit now
    # does that reset itself there: the answer of torch's own reset (which trains by force), after
    # as many out-of-memory trials, and no warning.
    first, second = (report["older_torch"] for report in fsdp)
    assert first["trials"] == second["trials"]
    for report in fsdp:
        older = report["older_torch"]
        assert older["batch_size"] == report["batch_size"]
        assert sum(outcome == "oom" for _, outcome in older["trials"]) >= 2
        assert older["restored"] and older["warned"] == []


def test_a_sharded_model_is_left_as_it_was(fsdp: list[dict[str, Any]]) -> None:
    for report in fsdp:
        assert report["restored"] and report["optimizer_state"] == 0 and report["gradients"] == 0


def test_a_sharded_parameter_counts_its_local_shard(fsdp: list[dict[str, Any]]) -> None:
    # Each rank holds half of every parameter (FSDP2 pads the shards to equal sizes); a DTensor's
    # wrapper reports the global size, which counted would double the fixed part.
    report = fsdp[0]
    assert report["counted_bytes"] == report["local_bytes"]
    assert report["local_bytes"] * 2 >= report["global_bytes"] > report["local_bytes"]


def test_a_zero_sharded_optimizer_s_local_state_is_counted_and_put_back(
    reports: list[dict[str, Any]],
) -> None:
    # ZeroRedundancyOptimizer keeps each rank's AdamW state in a local optimizer of its own (its
    # ``optim``): the search left that state as the trials made it, moments and steps, and counted
    # none of it as resident. The ranks hold different shares of the parameters.
    zero = [report["zero"] for report in reports]
    assert all(each["restored"] for each in zero)
    assert all(each["counted_bytes"] == each["local_bytes"] > 0 for each in zero)
    assert sum(each["local_parameters"] for each in zero) == 10  # 5 layers: a weight and a bias each


def test_a_rank_out_of_memory_in_its_zero_shard_s_step_leaves_no_rank_waiting(
    reports: list[dict[str, Any]],
) -> None:
    # ZeroRedundancyOptimizer steps each rank's shard, then broadcasts every shard. The ranks hold
    # different shares of AdamW's state, so near the boundary one rank ran out of memory in its
    # shard's step while the other went on into the broadcast, and both waited until the group's
    # timeout. A trial steps the shard alone: the search ends, every rank with the same trials,
    # and its answer trains by force with the broadcast; the next size does not.
    first, second = (report["zero_search"] for report in reports)
    assert first["trials"] == second["trials"] and "oom" in [outcome for _, outcome in first["trials"]]
    assert first["by_force"] == [True, False]

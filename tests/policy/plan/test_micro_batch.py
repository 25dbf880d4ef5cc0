"""The micro-batch decisions: the ones explore may time (plan's choice is tested in test_plan.py,
through plan), and MicroBatchStep's policy in plain Python: halving, giving up at 1, growing back."""

from __future__ import annotations

import re

import pytest

from batchfit.errors import ConfigurationError, DoesNotFitError
from batchfit.policy.plan.micro_batch import (
    MicroBatchChange,
    MicroBatchOutcome,
    MicroBatchShrink,
    merge_outcomes,
    micro_batch_sizes,
    split,
)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"global_batch_size": 1001, "world_size": 8},
            "global_batch_size (1001) is not divisible by world_size (8); 1000 or 1008 would work.",
        ),
        (
            {"multiple_of": 16},
            "no micro-batch in [1, 10] satisfies multiple_of=16; loosen one or widen the range.",
        ),
        (
            {"multiple_of": 4, "world_size": 2, "global_batch_size": 36},
            "no micro-batch in [1, 10] satisfies multiple_of=4 and global_batch_size=36 / world_size=2;",
        ),
    ],
)
def test_micro_batch_sizes_say_which_constraint_leaves_none(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        micro_batch_sizes(1, 10, **kwargs)
    assert message in str(info.value)
    assert micro_batch_sizes(1, 48, multiple_of=4, global_batch_size=96, world_size=2) == [
        4,
        8,
        12,
        16,
        24,
        48,
    ]


# MicroBatchStep's micro-batch --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("batch_size", "micro_batch_size", "sizes"),
    [(100, 32, [32, 32, 32, 4]), (96, 32, [32, 32, 32]), (5, 64, [5]), (3, 1, [1, 1, 1]), (1, 1, [1])],
)
def test_split_covers_every_sample_once(batch_size: int, micro_batch_size: int, sizes: list[int]) -> None:
    assert split(batch_size, micro_batch_size) == sizes
    assert sum(sizes) == batch_size


def test_halving_down_to_one_then_a_clear_error() -> None:
    policy = MicroBatchShrink(64)
    seen = []
    for step in range(6):
        change = policy.out_of_memory(step, 1000, "backward")
        seen.append((change.old_micro_batch_size, change.new_micro_batch_size))
    assert seen == [(64, 32), (32, 16), (16, 8), (8, 4), (4, 2), (2, 1)]
    assert policy.micro_batch_size == 1
    message = (
        "out of memory in forward on rank 1 at micro_batch_size 1 (optimizer step 9): not even one sample "
        "fits beside the weights, gradients and optimizer state. Lower the memory of a sample (shorter "
        "sequences, smaller images, activation checkpointing, mixed precision) or of the model, or use a "
        "device with more memory. The optimizer did not step and the batch's gradients were dropped. "
        "The out-of-memory: CUDA out of memory."
    )
    with pytest.raises(DoesNotFitError, match=f"^{re.escape(message)}$"):
        policy.out_of_memory(9, 1000, "forward on rank 1", "CUDA out of memory.")
    assert len(policy.history) == 6  # giving up is not a change


def test_halving_starts_from_the_micro_batch_that_ran() -> None:
    # A batch of 40 under micro_batch_size 64 ran as one micro-batch of 40: the retry runs 20s.
    policy = MicroBatchShrink(64)
    assert policy.out_of_memory(0, 40, "forward") == MicroBatchChange(0, 64, 20, "out of memory in forward")
    assert policy.sizes(40) == [20, 20]
    with pytest.raises(DoesNotFitError, match="at micro_batch_size 1"):
        MicroBatchShrink(8).out_of_memory(0, 1, "backward")  # a batch of one sample


def test_grows_back_after_clean_steps_up_to_the_start_only() -> None:
    policy = MicroBatchShrink(64, grow_after=3)
    policy.out_of_memory(0, 256, "backward")  # 64 -> 32
    policy.out_of_memory(0, 256, "backward")  # 32 -> 16, in the same optimizer step
    changes = [policy.stepped(step, 256) for step in range(12)]
    # Step 0 had the out-of-memory: not clean. Steps 1-3 are, so step 4 runs at 32; 4-6, so 7 runs at 64.
    assert [(index, change) for index, change in enumerate(changes) if change] == [
        (3, MicroBatchChange(4, 16, 32, "grew back after 3 clean steps")),
        (6, MicroBatchChange(7, 32, 64, "grew back after 3 clean steps")),
    ]
    assert policy.micro_batch_size == 64
    assert [change.reason for change in policy.history] == ["out of memory in backward"] * 2 + [
        "grew back after 3 clean steps"
    ] * 2


def test_an_out_of_memory_restarts_the_count_of_clean_steps() -> None:
    policy = MicroBatchShrink(16, grow_after=2)
    policy.out_of_memory(0, 64, "backward")
    assert policy.stepped(0, 64) is None and policy.stepped(1, 64) is None  # one clean step so far
    policy.out_of_memory(2, 64, "forward")  # 8 -> 4
    assert policy.stepped(2, 64) is None and policy.stepped(3, 64) is None
    assert policy.stepped(4, 64) == MicroBatchChange(5, 4, 8, "grew back after 2 clean steps")


def test_growth_never_passes_the_batch_and_never_happens_without_grow_after() -> None:
    policy = MicroBatchShrink(64, grow_after=1)
    policy.out_of_memory(0, 128, "backward")  # 32
    policy.out_of_memory(0, 128, "backward")  # 16
    policy.stepped(0, 128)
    assert policy.stepped(1, 24) == MicroBatchChange(2, 16, 24, "grew back after 1 clean step")
    assert policy.stepped(2, 24) is None  # a micro-batch of the whole batch cannot grow
    assert policy.stepped(3, 128) == MicroBatchChange(4, 24, 48, "grew back after 2 clean steps")

    never = MicroBatchShrink(64)
    never.out_of_memory(0, 128, "backward")
    assert all(never.stepped(step, 128) is None for step in range(1000))
    assert never.micro_batch_size == 32


def test_the_ranks_outcomes_merge_into_one_place_and_the_first_error() -> None:
    assert merge_outcomes([MicroBatchOutcome(100, None)], ranks=False) is None
    assert merge_outcomes([MicroBatchOutcome(100, ("backward", "OutOfMemoryError: x"))], ranks=False) == (
        "backward",
        "OutOfMemoryError: x",
    )
    assert merge_outcomes([MicroBatchOutcome(100, None), MicroBatchOutcome(100, None)], ranks=True) is None
    assert merge_outcomes(
        [MicroBatchOutcome(100, None), MicroBatchOutcome(100, ("backward", "OOM b"))], ranks=True
    ) == (
        "backward on rank 1",
        "rank 1: OOM b",
    )
    assert merge_outcomes(
        [
            MicroBatchOutcome(8, ("forward", "OOM a")),
            MicroBatchOutcome(8, None),
            MicroBatchOutcome(8, ("backward", "OOM c")),
        ],
        ranks=True,
    ) == (
        "forward on rank 0, backward on rank 2",
        "rank 0: OOM a",
    )
    message = (
        "the ranks' batches hold different numbers of samples (rank 0: 100, rank 1: 60); under a process "
        "group every rank's batch must hold as many (DistributedSampler gives each rank as many samples), "
        "so that the ranks run the same micro-batches."
    )
    with pytest.raises(ConfigurationError, match=f"^{re.escape(message)}$"):
        merge_outcomes([MicroBatchOutcome(100, None), MicroBatchOutcome(60, ("forward", "OOM"))], ranks=True)


def test_a_change_is_a_plain_record() -> None:
    change = MicroBatchChange(7, 64, 32, "out of memory in backward on rank 1")
    assert change.to_dict() == {
        "optimizer_step": 7,
        "old_micro_batch_size": 64,
        "new_micro_batch_size": 32,
        "reason": "out of memory in backward on rank 1",
    }


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"micro_batch_size": 0},
            (
                "micro_batch_size (0) must be a whole number of samples, 1 or more: the largest micro-batch "
                "to run, halved after each out-of-memory."
            ),
        ),
        (
            {"micro_batch_size": 8.0},
            (
                "micro_batch_size (8.0) must be a whole number of samples, 1 or more: the largest "
                "micro-batch to run, halved after each out-of-memory."
            ),
        ),
        (
            {"micro_batch_size": 8, "grow_after": 0},
            (
                "grow_after (0) must be a whole number of optimizer steps, 1 or more; None never grows "
                "the micro-batch back."
            ),
        ),
    ],
)
def test_bad_settings_name_the_parameter(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigurationError, match=f"^{re.escape(message)}$"):
        MicroBatchShrink(**kwargs)  # type: ignore[arg-type]

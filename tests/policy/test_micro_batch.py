"""Micro-batches that split a global batch: the ones explore may time (plan's choice is tested in
test_plan.py, through plan)."""

from __future__ import annotations

import pytest

from batchfit.errors import ConfigurationError
from batchfit.policy.micro_batch import micro_batch_sizes


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

"""The data check's fixtures: its in-process step on one thread (``one_thread``), since on a shared
2-core machine torch's thread pool otherwise makes a tiny model's step time swing with what else
runs, which is not what these tests are about."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)

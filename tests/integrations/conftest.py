"""What every trainer test here shares: one intra-op thread."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """One intra-op thread: the trainers' tiny models' ops are over before a second thread is of use,
    and on a busy 2-core machine it spins, waiting for a core; threads do not change what is
    allocated."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)

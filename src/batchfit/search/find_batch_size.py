"""``find_batch_size``: the largest batch whose train (or eval) step fits a memory budget."""

from __future__ import annotations

import logging
import time

import torch
from typing_extensions import Unpack

from batchfit.options import BatchSizes, Trials, Where, mode_named
from batchfit.policy.search.search import DEFAULT_TUNING, Tuning
from batchfit.policy.search.trial import Mode
from batchfit.progress import OnProgress
from batchfit.runtime.distributed.data_parallel import note_unwrapped
from batchfit.runtime.distributed.lockstep import ranks
from batchfit.runtime.steps.state import TrainingSnapshot
from batchfit.runtime.workloads.entry import check_entry
from batchfit.runtime.workloads.searchable import check_searchable
from batchfit.runtime.workloads.workload import Workload
from batchfit.search.search_capacity import search_capacity
from batchfit.search.search_result import SearchResult
from batchfit.search.search_run import Search
from batchfit.search.starting_evidence import NOTHING_KNOWN, Known, StartFrom, StartingEvidence
from batchfit.where import ResolvedDevice, WhereShorthand, target_of

logger = logging.getLogger(__name__)


def find_batch_size(
    workload: Workload,
    mode: Mode = "train",
    *,
    where: Where | None = None,
    sizes: BatchSizes = BatchSizes(),
    trials: Trials = Trials(),
    on_progress: OnProgress | None = None,
    start_from: StartFrom | None = None,
    **shorthand: Unpack[WhereShorthand],
) -> SearchResult:
    """Find the largest batch in ``sizes`` whose ``mode`` steps complete under a hard cap at
    ``memory_fraction`` x the device's memory, leaving model, optimizer and RNG exactly as they were.

    ``where.device`` is ``"cpu"``, ``"cuda"`` or ``"cuda:N"`` (default: cuda if available); with
    ``where.memory_limit`` (e.g. ``"2GiB"``) the device's capacity is that size (a smaller GPU, or
    a CPU standing in for one); the loose ``device``, ``memory_limit`` and ``memory_fraction`` are
    the one-line call's shorthand for ``where`` (one that disagrees with it is an error).
    ``mode`` is ``"train"`` or ``"eval"`` (``"val"`` too).
    The opening trials run ``trials.steps_per_trial`` steps; every later one, which may be the
    answer, runs ``trials.confirm_steps`` (default: 10 on CUDA, 40 with expandable segments, whose
    caching allocator fragments over the first steps; none on the CPU); an answer not found by such
    a trial runs them once more and, if they no longer fit, the search goes on below it. On CUDA
    the trials record their allocator requests, whose replay at other sizes places the later trials
    (``SearchResult.replays``), and the answer holds every smaller batch from
    ``sizes.must_fit_from`` (which sizes fit is not monotone there: ``SearchResult.band``). For
    ``mode="eval"`` with ``trials.eval_with_training_state`` the eval step is measured with
    gradients and optimizer state resident, as when validation runs inside a training loop.
    ``on_progress`` hears each trial start and end (``batchfit.Event``).
    ``start_from``: a saved prediction (``batchfit.predict``'s result, or the file ``batchfit
    predict --format json`` wrote) whose allocator records, replayed at this search's budget,
    place its first trial, and join its trials' own records (behind a caching allocator only).
    """
    check_entry("find_batch_size", workload, on_progress, sizes=(sizes, BatchSizes), trials=(trials, Trials))
    target = target_of("find_batch_size", where, shorthand)
    named = mode_named(mode)
    start = None if start_from is None else StartingEvidence.read(start_from, named)
    return find_on(target, workload, named, sizes, trials, on_progress, known=Known(start=start))


def find_on(
    target: ResolvedDevice,
    workload: Workload,
    mode: Mode,
    sizes: BatchSizes = BatchSizes(),
    trials: Trials = Trials(),
    on_progress: OnProgress | None = None,
    *,
    known: Known = NOTHING_KNOWN,
    tuning: Tuning = DEFAULT_TUNING,
) -> SearchResult:
    """``find_batch_size`` on a resolved target (explore, compare and analyze search on theirs);
    ``known``: what it reuses (``Known``: a cache shared by searches at other fractions, a saved
    prediction's records); ``tuning``: the search's constants."""
    cache, start = known.cache, known.start
    team = ranks()  # under torch.distributed every rank searches together
    # A rank whose workload is wrong stops every rank, not only itself.
    team.run(lambda: check_searchable(workload, mode, target.device))
    if start is not None:
        start.check_device(target.device)
    if team.world_size > 1:
        note_unwrapped(workload.model, team.world_size)
    started = time.perf_counter()
    optimizer = workload.optimizer if isinstance(workload.optimizer, torch.optim.Optimizer) else None
    snapshot = TrainingSnapshot.capture(workload.module, optimizer, workload.functions)
    try:
        snapshot.set_gradients_aside()
        # With several ranks the answer must fit the smallest device: one budget for all.
        capacity = min(team.run(lambda: search_capacity(workload, target, sizes.candidates(mode).count)))
        search = Search(
            workload, mode, target, sizes, trials, capacity, team, cache, on_progress, start, tuning
        )
        seed = team.shared(search.seed)  # where a saved prediction places the first trial
        outcome, forecast, replays, band = search.run(snapshot, seed)
    finally:
        snapshot.restore(gradients=True)
        target.device.release()
    return search.result(outcome, forecast, replays, time.perf_counter() - started, seed, band)

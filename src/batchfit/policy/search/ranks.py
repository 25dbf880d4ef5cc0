"""What the ranks of a lockstep search agree on, free of torch: one trial from every rank's own."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from batchfit.policy.search.trial import Trial


def merge_trials(trials: Sequence[Trial]) -> Trial:
    """The trial every rank acts on, from each rank's trial at the same batch size (index = rank).

    An out-of-memory on any rank is an out-of-memory, then over budget on any is over budget; the
    peaks are the largest, the step time the slowest (the ranks wait for each other in training),
    the allocator retries the most any rank needed. A failure's detail names its rank, and its
    steps are that rank's (the step that ran out).
    """
    if not trials:
        raise ValueError("merge_trials needs at least one rank's trial")
    sizes = {trial.batch_size for trial in trials}
    if len(sizes) != 1:
        raise ValueError(f"the ranks tried different batch sizes {sorted(sizes)}: the search is out of step")
    failed = [(rank, t) for rank, t in enumerate(trials) if t.outcome == "oom"] or [
        (rank, t) for rank, t in enumerate(trials) if t.outcome == "over_budget"
    ]
    first = trials[0]
    times = [trial.step_seconds for trial in trials if trial.step_seconds is not None]
    reserved = [trial.reserved_peak_bytes for trial in trials if trial.reserved_peak_bytes is not None]
    merged = replace(
        first,
        peak_bytes=max(trial.peak_bytes for trial in trials),
        step_seconds=None if failed or len(times) < len(trials) else max(times),
        optimizer_peak_bytes=_largest([trial.optimizer_peak_bytes for trial in trials]),
        activation_peak_bytes=_largest([trial.activation_peak_bytes for trial in trials]),
        allocator_retries=max(trial.allocator_retries for trial in trials),
        reserved_peak_bytes=max(reserved) if reserved else None,
    )
    if not failed:
        return merged
    rank, trial = failed[0]
    return replace(
        merged,
        outcome=trial.outcome,
        detail=f"rank {rank}: {trial.detail}",
        steps=trial.steps,
        steady_from=trial.steady_from,
        failed_at_step=trial.failed_at_step,
    )


def _largest(values: Sequence[int | None]) -> int | None:
    known = [value for value in values if value is not None]
    return max(known) if len(known) == len(values) else None

"""Which batch sizes explore times: the coarse pass's, a round's contenders, the refinement between
the recommendation and its neighbour, and the lone dips worth a second look. Pure functions."""

from __future__ import annotations

import math
from collections.abc import Sequence

from batchfit.policy.explore.choose import Objective, Recommendation
from batchfit.policy.explore.throughput import Point, estimates

#: A size at least this likely to be within the tolerance of the best stays in the rounds.
KEEP_CHANCE = 0.2


def coarse_sizes(candidates: Sequence[int], base_batch_size: int | None) -> list[int]:
    """Powers of two across the candidates (the nearest allowed to each), the bound, and the base."""
    chosen = {candidates[0], candidates[-1]}
    power = 1
    while power <= candidates[-1]:
        chosen.add(min(candidates, key=lambda batch: (abs(math.log2(batch / power)), batch)))
        power *= 2
    if base_batch_size is not None and base_batch_size in candidates:
        chosen.add(base_batch_size)
    return sorted(chosen)


def lone_dips(points: Sequence[Point]) -> set[int]:
    """Batch sizes seen only in rounds of their own that read slower than both measured
    neighbours. Throughput curves rise, level off and may fall, but seldom dip and recover, so
    such a reading is more likely a slow spell than the batch size; it is compared in a round
    before the exploration stops confident."""
    owners: dict[int, set[int]] = {}
    for point in points:
        for r in point.rounds:
            owners.setdefault(r, set()).add(point.batch_size)
    lone = [
        point.batch_size
        for point in points
        if point.rounds and all(len(owners[r]) == 1 for r in point.rounds)
    ]
    level = estimates(points, pooled=False)  # a dip is what the size's own windows say
    sizes = sorted(level)
    dips = set()
    for batch in lone:
        index = sizes.index(batch)
        neighbours = [level[size] for size in sizes[max(index - 1, 0) : index + 2] if size != batch]
        if len(neighbours) == 2 and level[batch] < min(neighbours):
            dips.add(batch)
    return dips


def focus_sizes(
    measured: Sequence[int],
    current: Recommendation,
    chances: dict[int, float] | None = None,
    keep_chance: float = KEEP_CHANCE,
) -> set[int]:
    """The contenders: the recommendation and the batch size measured just below it (the one the
    rule would take if it came within the tolerance), the fastest and the one just above it (which
    a slow spell during its first windows may have put behind), and any size whose chance of being
    within the tolerance of the best is ``keep_chance`` or more (a size that was the fastest must
    still be compared with the recommendation in the same rounds)."""
    chosen: set[int] = set()
    for batch, step in ((current.batch_size, -1), (current.best_batch_size, 1)):
        index = list(measured).index(batch)
        chosen.add(batch)
        if 0 <= index + step < len(measured):
            chosen.add(measured[index + step])
    return chosen | {batch for batch, chance in (chances or {}).items() if chance >= keep_chance}


def refinement(
    candidates: Sequence[int], measured: Sequence[int], recommended: int, objective: Objective
) -> int | None:
    """An unmeasured candidate between the recommendation and a measured neighbour: below it for
    the smallest-within-tolerance rule (where the smallest such batch lies), on either side for
    max-throughput. The roundest (most factors of two: 48 between 32 and 64), then the nearest the
    geometric middle: kernels tile by powers of two, and users want such sizes."""
    index = list(measured).index(recommended)
    neighbours = [measured[index - 1] if index > 0 else None]
    if objective == "max-throughput":
        neighbours.append(measured[index + 1] if index + 1 < len(measured) else None)
    for neighbour in neighbours:
        if neighbour is None:
            continue
        low, high = sorted((recommended, neighbour))
        between = [batch for batch in candidates if low < batch < high]
        if between:
            middle = math.sqrt(low * high)
            return min(between, key=lambda batch: (-(batch & -batch), abs(batch - middle)))
    return None

"""The throughput chooser and its confidence, on synthetic curves with known answers."""

from __future__ import annotations

import json
import math
import random
import re
import statistics
from pathlib import Path

import pytest

from batchfit.errors import ConfigurationError
from batchfit.policy.explore.choose import (
    CONFIDENCE_FLOOR,
    Recommendation,
    _confidences,
    confidences,
    recommend,
)
from batchfit.policy.explore.throughput import Point, _corrected, assess, estimates

BATCHES = [1, 2, 4, 8, 16, 32, 64, 128]


def curve(shape: dict[int, float], windows: int = 7, noise: float = 0.005, seed: int = 1) -> list[Point]:
    rng = random.Random(seed)
    return [
        Point(batch, tuple(value * (1 + rng.uniform(-noise, noise)) for _ in range(windows)))
        for batch, value in shape.items()
    ]


PLATEAU = {b: min(b, 16) * 100.0 for b in BATCHES}  # linear until 16, flat after
KNEE = {1: 100.0, 2: 190, 4: 350, 8: 600, 16: 960, 32: 1000, 64: 1010, 128: 1015}
DROP = {1: 100.0, 2: 200, 4: 400, 8: 800, 16: 1000, 32: 1000, 64: 700, 128: 400}  # memory pressure past 32


@pytest.mark.parametrize(
    ("shape", "smallest", "fastest"),
    # On a plateau the fastest is whichever window set ran luckiest: any batch on it.
    [(PLATEAU, 16, {16, 32, 64, 128}), (KNEE, 32, {128}), (DROP, 16, {16, 32})],
)
def test_rule_on_known_curves(shape: dict[int, float], smallest: int, fastest: set[int]) -> None:
    points = curve(shape)
    default = recommend(points)
    fast = recommend(points, objective="max-throughput")
    assert default is not None and fast is not None
    assert default.batch_size == smallest and fast.batch_size in fastest
    assert default.base_batch_size == 1
    assert default.speedup == pytest.approx(shape[smallest] / shape[1], rel=0.02)
    assert default.confidence >= 90  # clear curves, tight windows


def test_noisy_flat_curve_has_low_confidence_and_rises_with_evidence() -> None:
    flat = {b: 1000.0 for b in BATCHES}
    few = recommend(curve(flat, windows=3, noise=0.15, seed=3), tolerance=0.01, objective="max-throughput")
    many = recommend(curve(flat, windows=3, noise=0.002, seed=3), tolerance=0.01, objective="max-throughput")
    assert few is not None and many is not None
    assert few.confidence < 60 < many.confidence


def test_unsure_batch_gives_way_to_a_surely_fast_one_until_evidence_settles_it() -> None:
    # 32 is 1.5% below the best (128): inside a 3% tolerance, which noisy windows blur at first.
    def runs(windows: int, **kwargs: int) -> list[Recommendation]:
        found = [
            recommend(curve(KNEE, windows=windows, noise=0.05, seed=seed), **kwargs) for seed in range(30)
        ]
        return [score for score in found if score is not None]

    few, many, few_lax = runs(3), runs(96), runs(3, confidence_target=0)
    # Few windows: 32 is within the tolerance by its median often, but not surely; the rule then
    # takes a larger batch that is surer (64 or 128) more often than the plain rule would.
    assert sum(s.batch_size == 32 for s in few) < sum(s.batch_size == 32 for s in few_lax)
    assert statistics.mean(s.confidence for s in few) > statistics.mean(s.confidence for s in few_lax) + 5
    # Many windows settle it: 32, surely.
    assert sum(s.batch_size == 32 for s in many) >= 25 and min(s.confidence for s in many) >= 90
    # Without a confidence target the rule is the plain one on the estimates.
    for score, points in zip(
        few_lax, [curve(KNEE, windows=3, noise=0.05, seed=seed) for seed in range(30)], strict=True
    ):
        level = estimates(points)
        assert score.batch_size == min(b for b, m in level.items() if m >= 0.97 * max(level.values()))


def test_rounds_take_a_common_drift_out() -> None:
    """Two batch sizes 3% apart, measured in turn while the machine slows down and speeds up by up
    to 40% between rounds: with the rounds known, the ratio is recovered and the faster is sure."""
    rng = random.Random(5)
    drift = [1 + rng.uniform(-0.4, 0.4) for _ in range(8)]
    values = {8: 100.0, 16: 103.0}
    windows = {b: tuple(v * d * (1 + rng.gauss(0, 0.005)) for d in drift) for b, v in values.items()}
    labelled = [Point(b, windows[b], tuple(range(8))) for b in values]
    plain = [Point(b, windows[b]) for b in values]
    corrected = estimates(labelled)
    assert corrected[16] / corrected[8] == pytest.approx(1.03, abs=0.005)
    fast_labelled = recommend(labelled, tolerance=0.01, objective="max-throughput")
    fast_plain = recommend(plain, tolerance=0.01, objective="max-throughput")
    assert fast_labelled is not None and fast_plain is not None
    assert fast_labelled.batch_size == 16 and fast_labelled.confidence >= 95
    assert fast_plain.confidence < 70  # the drift looks like noise when the rounds are unknown
    with pytest.raises(ConfigurationError, match="2 round labels for 8 windows"):
        Point(8, windows[8], (0, 1))


def lucky_and_shared(seed: int) -> tuple[Point, list[Point], list[float]]:
    """16, 24 and 32 compared in 6 rounds while the machine drifts by up to 25%; 8 measured on
    its own, 4% above the others' typical level: as likely a fast spell as a faster batch."""
    rng = random.Random(seed)
    drift = [1 + rng.uniform(-0.25, 0.25) for _ in range(6)]
    shared = [
        Point(b, tuple(v * d * (1 + rng.gauss(0, 0.01)) for d in drift), tuple(range(1, 7)))
        for b, v in ((16, 100.0), (24, 101.0), (32, 102.0))
    ]
    level = 102.0 * statistics.median(drift) * 1.04
    lucky = Point(8, tuple(level * (1 + rng.gauss(0, 0.01)) for _ in range(3)), (0, 0, 0))
    return lucky, shared, drift


def test_a_size_measured_only_on_its_own_carries_the_drift() -> None:
    lucky, shared, drift = lucky_and_shared(0)
    fit = _corrected([lucky, *shared])
    spread = statistics.pstdev(math.log(d) for d in drift)
    assert fit.fitted == 6 and fit.drift == pytest.approx(spread, rel=0.35)  # the rounds measure it
    _, error = assess([lucky, *shared])
    assert error is not None
    assert error[8] >= 0.9 * fit.drift and max(error[b] for b in (16, 24, 32)) < 0.02
    # So the lucky size is taken less often than when the drift is invisible (no rounds).
    taken, taken_plain = 0, 0
    for seed in range(20):
        lucky, shared, _ = lucky_and_shared(seed)
        pick = recommend([lucky, *shared])
        plain = recommend([Point(p.batch_size, p.samples_per_second) for p in [lucky, *shared]])
        assert pick is not None and plain is not None
        taken, taken_plain = taken + (pick.batch_size == 8), taken_plain + (plain.batch_size == 8)
    assert taken < taken_plain == 20


def test_a_lone_fast_spell_does_not_outvote_windows_compared_in_rounds() -> None:
    """32 and 64 (3% faster) each get 3 coarse windows in a round of their own, 32's in a spell 10%
    faster than usual, then 3 rounds together while the machine drifts by up to 20%. As many lone
    windows as compared ones: a median of all of them would put 32 ahead; weighed by what each
    group can tell (a lone spell carries the drift the rounds measured), 64 stays ahead."""
    rng = random.Random(4)
    drift = [1.0, 0.8, 1.2]  # the typical round runs at the usual speed
    true = {32: 100.0, 64: 103.0}
    spell = {32: 1.10, 64: 1.0}

    def jitter() -> float:
        return 1 + rng.gauss(0, 0.004)

    points = [
        Point(
            batch,
            (*(value * spell[batch] * jitter() for _ in range(3)), *(value * d * jitter() for d in drift)),
            (index, index, index, 2, 3, 4),
        )
        for index, (batch, value) in enumerate(true.items())
    ]
    fit = _corrected(points)
    pooled = {batch: statistics.median(values) for batch, values in fit.corrected.items()}
    assert pooled[32] > pooled[64]  # what a plain median of every window would say
    corrected = estimates(points)
    assert corrected[64] / corrected[32] == pytest.approx(1.03, abs=0.01)
    pick = recommend(points, objective="max-throughput", tolerance=0.01)
    assert pick is not None and pick.batch_size == 64


def test_a_size_measured_in_few_windows_leans_on_its_measured_neighbours() -> None:
    """The mlp's shape at its bound: 256, 384 and 512 at 0.83, 0.92 and 1.0 of the best, compared
    in 24 rounds with windows 6% apart; 448, added late, in 3 of them, reading 9% above 512 (a
    lucky few windows: the line between 384 and 512 puts it at 0.96). On its own windows 448 is
    the fastest, past the confidence target; its neighbours pull it back near the line, and its
    confidence below the target, so explore measures on."""
    rng = random.Random(5)
    true = {256: 0.83, 384: 0.92, 512: 1.0}
    drift = [1 + rng.uniform(-0.2, 0.2) for _ in range(24)]
    points = [
        Point(b, tuple(1000 * v * d * math.exp(rng.gauss(0, 0.06)) for d in drift), tuple(range(24)))
        for b, v in true.items()
    ]
    lucky = tuple(1090 * d * math.exp(g) for d, g in zip(drift[-3:], (0.05, -0.05, 0.0), strict=True))
    points.append(Point(448, lucky, (21, 22, 23)))
    (own, own_error), (level, error) = assess(points, pool=False), assess(points)
    assert own_error is not None and error is not None
    assert max(own, key=own.__getitem__) == 448 and own[448] / own[512] > 1.05
    assert _confidences(own, own_error, 0.03, 400, 0)[448] > 0.9  # the target: it would stop there
    share = math.log(448 / 384) / math.log(512 / 384)
    line = own[384] * (own[512] / own[384]) ** share
    moved = math.log(own[448] / level[448])
    # Pulled most of the way to the line (its 3 windows weigh less than the line's 48), now below
    # 512, and surer than on its own.
    assert line < level[448] < own[448] and moved > 0.5 * math.log(own[448] / line)
    assert level[448] / level[512] < 1 + 0.25 * (own[448] / own[512] - 1) and error[448] < own_error[448]
    # A size measured as often as its neighbours moves far less; the ends of the range not at all.
    assert abs(math.log(level[384] / own[384])) < moved / 4
    assert level[256] == own[256] and level[512] == own[512]
    assert estimates(points) == level and estimates(points, pooled=False) == own
    pick = recommend(points)
    assert pick is not None and pick.confidence < 90
    # Every size's chance of being within the tolerance, as the recommendation's is computed.
    chances = confidences(points)
    assert round(100 * chances[pick.batch_size]) == pick.confidence
    assert chances[256] < 0.01 < chances[448] and set(chances) == set(level)
    assert confidences([Point(b, (1.0,)) for b in (1, 2)]) == {}  # no spread measured yet


def test_noisy_short_steps_do_not_blur_the_long_ones() -> None:
    """Small batches (short steps) are much noisier than large ones on a CPU: their spread must not
    be lent to the contenders at the top."""
    rng = random.Random(2)
    points = [
        Point(b, tuple(PLATEAU[b] * (1 + rng.uniform(-noise, noise)) for _ in range(7)))
        for b, noise in ((1, 0.4), (2, 0.4), (4, 0.3), (8, 0.01), (16, 0.01), (32, 0.01), (64, 0.01))
    ]
    pick = recommend(points)
    assert pick is not None and pick.batch_size == 16 and pick.confidence >= 90


def test_constraints_and_base() -> None:
    points = curve(PLATEAU)
    # global batch 96 on 2 devices: the micro-batch must divide 48.
    pick = recommend(points, allowed=lambda b: 48 % b == 0, base_batch_size=4)
    assert pick is not None and pick.batch_size == 16 and pick.base_batch_size == 4
    assert pick.speedup == pytest.approx(4.0, rel=0.02)
    assert pick.speedup_low is not None and pick.speedup_high is not None
    assert pick.speedup_low < 4.0 < pick.speedup_high  # the windows' 0.5% noise: a narrow interval
    assert pick.speedup_high / pick.speedup_low < 1.02
    assert pick.line() == (
        f"Current recommended micro_batch_size: 16, estimated performance: {pick.speedup:.2f}x base "
        f"[{pick.speedup_low:.2f}, {pick.speedup_high:.2f}], confidence score: {pick.confidence} (out of 100)"
    )
    assert recommend(points, allowed=lambda b: b > 1000) is None


@pytest.mark.parametrize("rounds", [False, True])
def test_a_batch_size_with_no_throughput_is_never_chosen(rounds: bool) -> None:
    points = [
        Point(batch, values, (0, 1) if rounds else ())
        for batch, values in ((1, (0.0, 0.0)), (2, (10.0, 11.0)), (4, (19.0, 21.0)))
    ]
    pick = recommend(points)
    assert pick is not None and pick.batch_size == 4 and pick.base_batch_size == 1
    assert estimates(points)[1] == 0.0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"tolerance": 1.5}, "tolerance=1.5 must be in [0, 1)"), ({"objective": "fast"}, "objective='fast'")],
)
def test_bad_input(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigurationError, match=re.escape(message)):
        recommend(curve(PLATEAU), **kwargs)  # type: ignore[arg-type]


def test_recorded_curve_from_a_real_run() -> None:
    """A run of `batchfit explore --example cnn --max-batch-size 64` recorded on this 2-core CPU: a
    coarse pass, then rounds over the contenders (the rounds are in the file)."""
    recorded = json.loads((Path(__file__).parent / "data" / "explore_cnn_cpu.json").read_text())
    points = [
        Point(p["batch_size"], tuple(p["samples_per_second"]), tuple(p["rounds"])) for p in recorded["points"]
    ]
    pick = recommend(points)
    assert pick is not None  # what explore reported (recorded before the speed-up had an interval)
    assert {key: pick.to_dict()[key] for key in recorded["recommendation"]} == recorded["recommendation"]
    corrected = estimates(points)
    assert corrected == pytest.approx({p["batch_size"]: p["estimate"] for p in recorded["points"]})
    best = max(corrected.values())
    assert corrected[pick.batch_size] >= 0.97 * best  # within the tolerance of the best
    assert pick.speedup == pytest.approx(corrected[pick.batch_size] / corrected[1])
    # Sizes measured only in the coarse pass, alone in their rounds, are left as measured (before
    # the pooling with their neighbours).
    alone = [p for p in points if len(set(p.rounds)) == 1]
    own = estimates(points, pooled=False)
    assert alone and all(own[p.batch_size] == pytest.approx(p.median) for p in alone)
    # The plain rule (no confidence asked): a wider tolerance lets a smaller batch qualify.
    plain, wide = (
        recommend(points, confidence_target=0),
        recommend(points, tolerance=0.15, confidence_target=0),
    )
    assert plain is not None and wide is not None and wide.batch_size < plain.batch_size


def test_one_window_per_size_settles_nothing_and_the_line_says_so() -> None:
    """No spread measured: the rule picks on the medians alone at confidence 0, which is a leaning
    (the floor is 50), and its speed-up has no interval."""
    points = [Point(batch, (100.0 * min(batch, 16),)) for batch in BATCHES]
    pick = recommend(points)
    assert pick is not None and pick.batch_size == 16 and pick.confidence == 0
    assert (
        (pick.speedup_low, pick.speedup_high, pick.floor)
        == (None, None, CONFIDENCE_FLOOR)
        == (None, None, 50)
    )
    assert not pick.settled
    assert pick.line() == (
        "No micro_batch_size settled: leaning to 16, estimated performance: 16.00x base, confidence "
        "score: 0 (out of 100), below 50: the measurements do not yet tell the sizes apart"
    )


def test_a_confidence_target_below_the_floor_lowers_it() -> None:
    """confidence_target=0 asks for the plain rule on the medians: its answer is settled."""
    points = [Point(batch, (100.0 * min(batch, 16),)) for batch in BATCHES]
    plain = recommend(points, confidence_target=0)
    assert plain is not None and plain.floor == 0 and plain.settled
    assert plain.line().startswith("Current recommended micro_batch_size: 16, estimated performance: 16.00x")
    some = recommend(points, confidence_target=30)
    assert some is not None and some.floor == 30 and not some.settled


def test_the_speed_up_interval_covers_the_true_ratio_and_the_base_has_none() -> None:
    """A curve straight in log-log (the pooling with neighbours adds no bias) and 3% log-normal
    noise per window, 5 windows, 300 times: the 90% interval of the speed-up of the fastest (128,
    clearly) over batch 1 covers the true ratio about 9 times in 10. The base's own speed-up has
    no interval."""
    shape = {batch: 100.0 * batch**0.5 for batch in BATCHES}
    covered = 0
    for seed in range(300):
        rng = random.Random(seed)
        points = [
            Point(batch, tuple(value * math.exp(rng.gauss(0, 0.03)) for _ in range(5)))
            for batch, value in shape.items()
        ]
        pick = recommend(points)
        assert pick is not None and pick.batch_size == 128
        assert pick.speedup_low is not None and pick.speedup_high is not None
        covered += pick.speedup_low <= shape[128] / shape[1] <= pick.speedup_high
    assert 0.86 <= covered / 300 <= 0.94
    based = recommend(curve(PLATEAU), base_batch_size=16)
    assert based is not None and based.batch_size == based.base_batch_size == 16
    assert (based.speedup, based.speedup_low, based.speedup_high) == (1.0, None, None)

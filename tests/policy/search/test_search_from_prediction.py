"""find's search from a saved prediction (``start_from``): the prediction's answer is the first trial,
its replay places the next where a real trial refutes it, and the summary says what each trial was
for. On the H200's recorded histories replayed as a device (``bench/trials_replay.py``) and on
curves given by hand."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from batchfit.policy.search.search import Candidates, Predicted, search_and_confirm
from batchfit.policy.search.search_account import trials_account
from batchfit.policy.search.trial import Trial
from batchfit.search.search_result import SearchResult

# bench/ is a directory of scripts, not a package: its directory goes on the path.
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
import trials_replay

CANDIDATES = Candidates.between(1, 512)


class Curve:
    """A forecast that says what ``fits`` says at every size (a replay that knows the curve)."""

    def __init__(self, fits: Callable[[int], bool]) -> None:
        self.said, self.asked = fits, 0

    def fits(self, batch_size: int) -> bool | None:
        self.asked += 1
        return self.said(batch_size)

    def evidence(self) -> int:
        return 0


def device(fits: Callable[[int], bool], log: list[tuple[int, int]]) -> tuple[Callable[[int], Trial], ...]:
    """A device whose trials fit where ``fits`` says: its short trial (2 steps) and its longer one (10)."""

    def run(batch_size: int, steps: int) -> Trial:
        log.append((batch_size, steps))
        outcome = "ok" if fits(batch_size) else "oom"
        return Trial(
            batch_size, outcome, 1000 * batch_size, None, reserved_peak_bytes=2000 * batch_size, steps=steps
        )

    return (lambda batch: run(batch, 2)), (lambda batch: run(batch, 10))


def searched(
    truth: Callable[[int], bool], forecast: Callable[[int], bool] | None, seed: int | None
) -> list[int]:
    log: list[tuple[int, int]] = []
    short, long = device(truth, log)
    said = Curve(forecast) if forecast else None
    outcome = search_and_confirm(
        short, CANDIDATES, 10**9, predicted=Predicted(seed=seed), longer=long, forecast=said
    )
    assert outcome.batch_size is not None and truth(outcome.batch_size) and not truth(outcome.batch_size + 1)
    return [batch for batch, _ in log]


@pytest.mark.parametrize(
    ("workload", "cap_bytes", "seed", "answer", "sizes"),
    [
        # The prediction fell short (its replay's gallop stopped in a band below): 493 is the
        # replay's answer above it, and 494 fails.
        ("mlp", 115343360, 334, 493, [334, 493, 494]),
        # The replay disagrees at 190-200 (cuDNN's workspaces): it fails 190-192, where the H200
        # fits, so the prediction is the top of its band below them (189), and the search climbs
        # past them; then the check below the answer runs the replay's closest call, 177.
        ("cnn", 423624704, 189, 192, [189, 190, 191, 192, 194, 193, 177]),
        # The top of the band that holds every size below (141-144 and 149-152 fail below 156).
        ("transformer", 413138944, 140, 140, [140, 141]),
        ("resnet50", 11274289152, 124, 124, [124, 125]),
        ("resnet50-amp", 11274289152, 243, 242, [243, 242]),  # before: 243 2 4 242 (the opening)
        ("cnn", 364904448, 160, 160, [160, 161]),
    ],
)
def test_each_h200_case_is_placed_in_the_trials_docs_search_md_gives(
    workload: str, cap_bytes: int, seed: int, answer: int, sizes: list[int]
) -> None:
    (truth,) = [case[4] for case in trials_replay.cases() if case[:2] == (workload, cap_bytes)]
    started, outcome, modelled = trials_replay.replay_case(workload, cap_bytes, truth)
    assert started == seed and outcome.batch_size == answer
    assert [trial.batch_size for trial in outcome.trials] == sizes
    assert all(trial.steps == 10 for trial in outcome.trials)  # each may be the answer: it confirms
    # Every trial's verdict is the H200's own, but the mlp's 334: below its scan (433-553), taken to fit.
    assert modelled == ({334} if workload == "mlp" else set())


def test_a_prediction_one_over_is_answered_by_the_size_below_not_the_opening() -> None:
    # The replay said 101 fits; the device says 100 is the most. Without the replay the opening
    # (2 and 4) and the line take 10 trials.
    assert searched(lambda b: b <= 100, lambda b: b <= 101, seed=101) == [101, 100]
    assert searched(lambda b: b <= 100, None, seed=101) == [101, 2, 4, 52, 76, 88, 94, 97, 99, 100]


def test_a_refuted_band_is_skipped_to_the_band_below() -> None:
    # The replay fits up to 89 and again at 93-100; the device only up to 89. 100 fails: the
    # replay's band 93-100 is refuted, the top of its band below (89) runs, then 90 above it.
    banded = lambda b: b <= 89 or 93 <= b <= 100  # noqa: E731
    assert searched(lambda b: b <= 89, banded, seed=100) == [100, 89, 90]
    # Without a saved prediction (no seed) its replay comes from the opening's small trials, which
    # do not know the bands: the search does not skip them.
    assert searched(lambda b: b <= 89, banded, seed=None) == [2, 4, 100, 97, 91, 47, 69, 80, 85, 88, 89, 90]


def test_a_replay_refuted_above_and_below_is_left_for_a_bisection() -> None:
    # As the cnn on the H200: the replay's 100 fails, its 89 fits, and 90, where it said fail,
    # fits too: the search bisects between 90 and 100 without asking it again.
    banded = lambda b: b <= 89 or 93 <= b <= 100  # noqa: E731
    assert searched(lambda b: b <= 94, banded, seed=100) == [100, 89, 90, 95, 92, 93, 94]


def trial(batch_size: int, fits: bool) -> Trial:
    return Trial(batch_size, "ok" if fits else "oom", 1, None, steps=10)


def test_the_account_names_each_trial_and_why_any_beyond_two_ran() -> None:
    right = (trial(156, True), trial(157, False))
    assert trials_account(right, 156, 156) == (
        "2 real trials: the prediction's 156 fitted 10 steps, 157 above it failed."
    )
    refuted = (trial(200, False), trial(189, True), trial(190, True), trial(195, False), trial(192, True))
    refuted += (trial(193, False),)
    assert trials_account(refuted, 192, 200) == (
        "6 real trials: the prediction's 200 failed, 189 fitted 10 steps, 190 fitted 10 steps, 195 "
        "failed, the answer 192 fitted 10 steps, 193 above it failed; 4 trials more than a right "
        "prediction needs, as the prediction's 200 failed on the device."
    )
    low = (trial(334, True), trial(493, True), trial(494, False))
    assert trials_account(low, 493, 334).endswith(
        "; 1 trial more than a right prediction needs, as the prediction's 334 fell short of the "
        "device's answer."
    )
    assert trials_account(right, 156, None) == ""


def test_the_summary_says_which_trials_a_saved_prediction_still_needed() -> None:
    result = SearchResult(
        mode="train", batch_size=242, peak_bytes=1, budget_bytes=2, capacity_bytes=2, memory_fraction=1.0,
        device="cuda:0", trials=(trial(243, False), trial(242, True)), predicted_trials=(), memory_model=None,
        stop_reason="boundary", search_seconds=1.0, min_batch_size=1, max_batch_size=512, multiple_of=None,
        steps_per_trial=2, confirm_steps=10, started_from=243,
    )  # fmt: skip
    assert result.summary().endswith(
        "where the saved prediction put it. 2 real trials: the prediction's 243 failed, the answer 242 "
        "fitted 10 steps."
    )
    assert "real trial" not in SearchResult(**{**result.__dict__, "started_from": None}).summary()

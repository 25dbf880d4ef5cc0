"""advise's ranking in plain Python: what is worth saying, in which order, and what only saves memory."""

from __future__ import annotations

from batchfit.policy.explore.advice import Change, costly, counted_speedup, noisy, rank, slower


def change(what: str, speedup: float | None, batch_gain: float | None) -> Change:
    return Change(what, speedup, batch_gain, f"batchfit compare --techniques {what}")


def test_changes_are_ranked_by_speed_then_batch_and_small_ones_dropped() -> None:
    changes = [
        change("slower-but-bigger", 0.6, 2.0),
        change("noise", 1.02, 1.01),
        change("bigger", 1.0, 1.8),
        change("faster", 1.7, 1.1),
        change("fastest", 2.0, None),
        change("data", 1.5, None),
    ]
    assert [c.what for c in rank(changes)] == ["fastest", "faster", "data", "bigger"]
    assert [c.what for c in costly(changes)] == ["slower-but-bigger"]


def test_a_line_names_the_gains_and_completes_the_evidence_command() -> None:
    line = change("amp", 1.5, 1.79).line("--example cnn --device cpu")
    assert line == (
        "amp: 1.50x the throughput, 1.79x the largest batch "
        "(evidence: batchfit compare --techniques amp --example cnn --device cpu)"
    )
    assert Change("x", None, None, "batchfit find").line() == "x: not measured (evidence: batchfit find)"


def test_a_batch_gain_at_the_search_s_bound_is_a_lower_bound() -> None:
    bounded = Change("amp", 1.2, 1.19, "batchfit compare --techniques amp", batch_gain_at_least=True)
    assert bounded.line() == (
        "amp: 1.20x the throughput, at least 1.19x the largest batch "
        "(evidence: batchfit compare --techniques amp)"
    )


def noisy_change(what: str, speedup: float, low: float, high: float, batch_gain: float | None) -> Change:
    return Change(what, speedup, batch_gain, f"batchfit compare --techniques {what}", False, low, high)


def test_a_speed_up_within_noise_is_not_ranked_as_a_gain() -> None:
    """A ratio whose 90% interval includes 1 counts as no change in speed: alone it is listed apart
    (``noisy``), with a real batch gain it ranks by that gain after every real speed-up, and a
    slow-down within noise does not make a batch gain costly."""
    changes = [
        noisy_change("lucky", 1.29, 0.92, 1.81, None),  # 1.29x, but the readings cannot tell it from 1
        change("faster", 1.1, None),  # one reading: no interval, taken as measured
        noisy_change("surely-faster", 1.05, 1.02, 1.08, None),
        noisy_change("bigger-maybe-slower", 0.9, 0.8, 1.01, 1.5),
        noisy_change("bigger-surely-slower", 0.9, 0.85, 0.95, 1.5),
    ]
    assert [c.what for c in rank(changes)] == ["faster", "surely-faster", "bigger-maybe-slower"]
    assert [c.what for c in costly(changes)] == ["bigger-surely-slower"]
    assert [c.what for c in noisy(changes)] == ["lucky"]
    assert changes[0].within_noise and not changes[1].within_noise and not changes[2].within_noise


def test_a_line_gives_the_interval_and_says_within_noise() -> None:
    assert noisy_change("amp", 1.29, 1.1, 1.52, 1.79).line() == (
        "amp: 1.29x the throughput [1.10, 1.52], 1.79x the largest batch "
        "(evidence: batchfit compare --techniques amp)"
    )
    assert noisy_change("amp", 1.29, 0.92, 1.81, None).line("--example cnn") == (
        "amp: 1.29x the throughput [0.92, 1.81] (within noise) "
        "(evidence: batchfit compare --techniques amp --example cnn)"
    )


def test_a_clear_slow_down_is_not_noise_and_is_listed_as_slower() -> None:
    # One step 18x the baseline's: no interval, but no doubt either; with a wide interval that
    # includes 1 it would read within noise were it not marked clearly slower.
    slow = Change("amp", 1 / 18, None, "batchfit compare --techniques amp --time-slow", clearly_slower=True)
    wide = Change("amp", 0.5, None, "e", speedup_low=0.2, speedup_high=1.2, clearly_slower=True)
    faster = change("faster", 1.7, None)
    assert not slow.within_noise and not wide.within_noise and counted_speedup(wide) == 0.5
    assert rank([slow, wide, faster]) == (faster,)
    assert noisy([slow, wide, faster]) == () and costly([slow, wide, faster]) == ()
    assert slower([slow, wide, faster]) == (slow, wide)
    assert slow.line().startswith("amp: 0.06x the throughput")

"""advise's ranking in plain Python: what is worth saying, in which order, and what only saves memory."""

from __future__ import annotations

from batchfit.policy.advice import Change, costly, rank


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

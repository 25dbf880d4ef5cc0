"""How far scaling pays, by the noise scale: the steps and samples ratios against McCandlish et al.'s
S(B) and E(B) simulated directly, the plan's lines and its warning far above the noise scale."""

from __future__ import annotations

import json
import math

import pytest

from batchfit.errors import ConfigurationError
from batchfit.policy.noise.noise_scale import NoiseScale
from batchfit.policy.noise.scaling_payoff import FAR_ABOVE_NOISE_SCALE, scaling_payoff
from batchfit.policy.plan.plan import plan
from batchfit.policy.plan.plan_options import Baseline, Scaling, TrainingFacts


def steps(batch: float, noise: float) -> float:
    return 1000.0 * (1 + noise / batch)  # S_min = 1000: any value, the ratios divide it out


@pytest.mark.parametrize("noise", [3.0, 100.0, 700.0, 5000.0])
@pytest.mark.parametrize(("base", "target"), [(256, 256), (256, 1024), (64, 8192), (1024, 128)])
def test_the_ratios_are_the_simulated_runs(noise: float, base: int, target: int) -> None:
    payoff = scaling_payoff(target, base, noise)
    assert payoff.steps_ratio == pytest.approx(steps(target, noise) / steps(base, noise))
    assert payoff.samples_ratio == pytest.approx(steps(target, noise) * target / (steps(base, noise) * base))
    assert payoff.proportional_steps_ratio == base / target
    far = target >= FAR_ABOVE_NOISE_SCALE * noise
    assert (payoff.warning() is not None) == far


def test_near_the_noise_scale_a_doubled_batch_cuts_a_quarter_of_the_steps_and_adds_half_the_samples() -> None:
    payoff = scaling_payoff(2000, 1000, 1000.0)
    assert (payoff.steps_ratio, payoff.samples_ratio) == pytest.approx((0.75, 1.5))


def test_the_plan_says_how_far_scaling_pays_and_warns_far_above_the_noise_scale() -> None:
    measured = NoiseScale(500.0, 400.0, 640.0, 12, 32, 256, 1.0, 500.0)
    result = plan(
        4096,
        Baseline(0.1, 256),
        world_size=8,
        max_micro_batch_size=512,
        scaling=Scaling(optimizer="sgd"),
        training=TrainingFacts(noise_scale=measured),
    )
    assert result.payoff == scaling_payoff(4096, 256, measured)
    lines = result.table().splitlines()
    assert lines[4] == (
        "noise_scale 500 [400, 640]: from base_batch_size 256 to global_batch_size 4096 the steps to a "
        "target fall to 0.38x (in proportion: 0.06x) and the samples grow to 6.08x; scaling pays up to "
        "about 500 samples per step (beyond it a doubled batch cuts the steps by under a quarter)"
    )
    assert lines[5] == (
        "for SGD the same model puts the best learning rate at 2.63x base_learning_rate, against the "
        "linear rule's 16x (McCandlish et al. 2018: it grows as 1 / (1 + B_noise / B), levelling off "
        "above the noise scale)"
    )
    assert result.warnings == (
        (
            "global_batch_size 4096 is 8.2x the noise scale (500): a target takes 1.12x the fewest steps any "
            "batch can, a doubled batch would cut them by only 5%, and it spends 9.2x the fewest samples; a "
            "global batch of 2000 or less (4x the noise scale) takes few more steps on far fewer samples."
        ),
    )
    assert json.loads(result.to_json())["payoff"]["steps_ratio"] == pytest.approx(result.payoff.steps_ratio)


def test_under_the_square_root_rule_no_sgd_learning_rate_is_given_and_near_the_noise_scale_no_warning() -> (
    None
):
    result = plan(
        1024,
        Baseline(0.001, 256),
        max_micro_batch_size=1024,
        scaling=Scaling(optimizer="adamw"),
        training=TrainingFacts(noise_scale=1000.0),
    )
    assert [line for line in result.table().splitlines() if "noise_scale" in line or "SGD" in line] == [
        result.payoff.lines("sqrt", result.learning_rate_scale)[0]  # type: ignore[union-attr]
    ]
    assert result.warnings == ()


def test_an_unresolved_noise_scale_takes_the_steps_to_fall_in_proportion() -> None:
    unresolved = NoiseScale(math.inf, None, None, 6, 32, 256, -1.0, 10.0)
    result = plan(
        1024, Baseline(0.1, 256), max_micro_batch_size=1024, training=TrainingFacts(noise_scale=unresolved)
    )
    assert result.payoff is not None
    assert (result.payoff.steps_ratio, result.payoff.samples_ratio) == (0.25, 1.0)
    assert result.warnings == ()
    assert json.loads(json.dumps(result.to_dict(), allow_nan=False))["payoff"]["noise_scale"] is None
    assert result.table().splitlines()[4].startswith("noise_scale unresolved: from base_batch_size 256")


def test_a_noise_scale_that_is_not_positive_is_refused_when_the_facts_are_made() -> None:
    with pytest.raises(ConfigurationError, match=r"^noise_scale must be a positive number of samples"):
        TrainingFacts(noise_scale=-5.0)

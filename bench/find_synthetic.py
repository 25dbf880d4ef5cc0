"""``find``'s search on synthetic caching-allocator curves shaped to the H100's searches (a tuning aid).

Until a GPU's trials are recorded (``bench/find_curves.py --device cuda``), this is where a change
to the search is judged for CUDA. Each curve is a trial oracle: the allocated peak is a line bent
by up to -4%..+8% at the boundary (the H100's line through batches 2 and 4 missed ResNet-50's slope
there by about 4%), the allocator needs 0.5-3.5% more in 2 MiB segments, varying with the batch
(not monotone in the overhead, monotone in the verdict), reports what it reserved (up to 3% more,
cache it merely kept) and, over 10 steps, needs up to ``--later`` more than over 2. With
``--jitter J`` the allocated peak is also off its curve by up to +-J/2 of the cap at each size (a
workspace that changes with the cuDNN algorithm chosen): the verdicts are then not monotone, and
the answer may differ from the truth by a size. The shapes
follow the benchmark's GPU cases: ResNet-50 in fp32 and with AMP under 10.5 GiB, GPT-2 under
16 GiB, and the built-in CNN and transformer under what they reserved on the H100.

For each case it runs ``search_and_confirm`` as ``find`` does on CUDA (the confirming trial inside
the search past its opening) beside the search with the confirmation after it (the policy
measured on the H100), and counts Lightning's binsearch on the same oracle. Exactness is against
brute force over 10-step trials. Seconds are modelled (a fixed cost per trial and a step time per
sample, fitted by eye to the H100's ResNet-50 run): read them as a direction, not a measurement.

Run: ``.venv/bin/python bench/find_synthetic.py [--curves 60] [--later 0.006] [--jitter 0.005]``
(a few seconds).
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
from collections.abc import Callable
from dataclasses import dataclass

from find_replay import LIGHTNING_START, doubling_then_bisection

from batchfit.policy.search.search import Candidates, SearchOutcome, confirm, search, search_and_confirm
from batchfit.policy.search.trial import Trial

MiB, GiB = 2**20, 2**30
SEGMENT = 2 * MiB
#: (fixed bytes, bytes per sample, cap, seconds per sample of a step) per case.
CASES: dict[str, tuple[float, float, int, float]] = {
    "resnet50": (0.45 * GiB, 80e6, int(10.5 * GiB), 0.0009),
    "resnet50-amp": (0.4 * GiB, 40e6, int(10.5 * GiB), 0.00045),
    "gpt2": (2.5 * GiB, 1.6 * GiB, 16 * GiB, 0.06),
    "cnn": (40 * MiB, 1.9 * MiB, 348 * MiB, 0.0001),
    "transformer": (60 * MiB, 2.2 * MiB, 394 * MiB, 0.0001),
}
TRIAL_SECONDS = 0.55  # what a trial costs beside its steps (state restored, cache emptied)
LIGHTNING_TRIAL_SECONDS = 0.75
SHORT, LONG = 2, 10


@dataclass
class Curve:
    """One synthetic device: ``trial(batch, steps)``, deterministic per (case, seed)."""

    case: str
    seed: int
    later_max: float
    jitter: float = 0.0

    def __post_init__(self) -> None:
        self.fixed, self.per_sample, self.cap, self.step_per_sample = CASES[self.case]
        rng = random.Random(f"{self.case}:{self.seed}")
        self.bend = rng.uniform(-0.04, 0.08)
        self.overhead_low = rng.uniform(0.0, 0.02)
        self.overhead_span = rng.uniform(0.005, 0.03)
        self.kept = rng.uniform(0.0, 0.03)
        self.later = rng.uniform(0.0, self.later_max)
        self.reference = (self.cap - self.fixed) / self.per_sample

    def allocated(self, batch: int) -> float:
        off = self.jitter * self.cap * (random.Random(f"{self.case}:{self.seed}:{batch}:off").random() - 0.5)
        bent = 1 + self.bend * math.tanh(batch / self.reference)
        return self.fixed + self.per_sample * batch * bent + off

    def trial(self, batch: int, steps: int) -> Trial:
        x = batch / self.reference
        wave = 0.5 + 0.25 * math.sin(17 * x + self.seed) + 0.25 * math.sin(5 * x + 2 * self.seed)
        grown = self.later if steps > SHORT else 0.0
        allocated = self.allocated(batch)
        overhead = self.overhead_low + self.overhead_span * wave + grown
        need = SEGMENT * math.ceil(allocated * (1 + overhead) / SEGMENT)
        if need > self.cap:
            return Trial(batch, "oom", self.cap, None, "CUDA out of memory", steps=steps)
        kept = random.Random(f"{self.case}:{self.seed}:{batch}").random() * self.kept
        reserved = min(self.cap, SEGMENT * math.ceil(need * (1 + kept) / SEGMENT))
        return Trial(
            batch,
            "ok",
            int(allocated),
            self.step_seconds(batch),
            activation_peak_bytes=int(allocated),
            optimizer_peak_bytes=int(0.9 * self.fixed),
            reserved_peak_bytes=reserved,
            steps=steps,
        )

    def step_seconds(self, batch: int) -> float:
        return 0.003 + self.step_per_sample * batch

    def truth(self, upper: int) -> int | None:
        fitting = [b for b in range(1, upper + 1) if self.trial(b, SHORT).fits and self.trial(b, LONG).fits]
        return max(fitting) if fitting else None

    def seconds(self, trials: tuple[Trial, ...]) -> float:
        """A trial's fixed cost and its steps (a failing one stops at its first step or so)."""
        total = 0.0
        for trial in trials:
            steps = (trial.steps or SHORT) if trial.fits else (1 if (trial.steps or SHORT) <= SHORT else 3)
            total += TRIAL_SECONDS + steps * self.step_seconds(trial.batch_size)
        return total

    def lightning(self, upper: int) -> tuple[int, float]:
        """Trials and modelled seconds of Lightning's binsearch (``find_replay``'s model of it)."""
        tried = doubling_then_bisection(lambda b: self.trial(b, SHORT).fits, LIGHTNING_START, upper)
        seconds = sum(
            LIGHTNING_TRIAL_SECONDS + (SHORT if self.trial(b, SHORT).fits else 1) * self.step_seconds(b)
            for b in tried
        )
        return len(tried), seconds


Policy = Callable[[Curve, Candidates], SearchOutcome]


def inside(curve: Curve, candidates: Candidates) -> SearchOutcome:
    return search_and_confirm(
        lambda b: curve.trial(b, SHORT), candidates, curve.cap, longer=lambda b: curve.trial(b, LONG)
    )


def after(curve: Curve, candidates: Candidates) -> SearchOutcome:
    outcome = search(lambda b: curve.trial(b, SHORT), candidates, curve.cap)
    return confirm(outcome, lambda b: curve.trial(b, LONG), candidates, curve.cap)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--curves", type=int, default=60, help="curves per case (default: %(default)s)")
    parser.add_argument(
        "--later", type=float, default=0.006, help="most extra need over 10 steps (default: %(default)s)"
    )
    parser.add_argument(
        "--jitter", type=float, default=0.0, help="allocated peaks off the curve, of the cap (default: 0)"
    )
    args = parser.parse_args()
    candidates = Candidates.between(1, 512)
    policies: dict[str, Policy] = {"confirm inside": inside, "confirm after": after}
    print(f"{'case':13s} {'policy':15s} {'exact':>7s} {'trials':>6s} {'max':>4s}", end="")
    print(f" {'L/bf trials':>11s} {'L/bf s':>7s}")
    for case in CASES:
        curves = [Curve(case, seed, args.later, args.jitter) for seed in range(args.curves)]
        truths = [curve.truth(candidates.count) for curve in curves]
        lightning = [curve.lightning(candidates.count) for curve in curves]
        for name, policy in policies.items():
            outcomes = [policy(curve, candidates) for curve in curves]
            exact = sum(o.batch_size == t for o, t in zip(outcomes, truths, strict=True))
            trials = [len(o.trials) for o in outcomes]
            trial_ratio = statistics.mean(lt / n for (lt, _), n in zip(lightning, trials, strict=True))
            second_ratio = statistics.mean(
                seconds / curve.seconds(outcome.trials)
                for (_, seconds), curve, outcome in zip(lightning, curves, outcomes, strict=True)
            )
            print(
                f"{case:13s} {name:15s} {exact:>3d}/{len(curves):<3d} {statistics.mean(trials):6.2f} "
                f"{max(trials):4d} {trial_ratio:10.2f}x {second_ratio:6.2f}x"
            )


if __name__ == "__main__":
    main()

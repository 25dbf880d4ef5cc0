"""Replay ``find``'s search on trials recorded by ``bench/find_curves.py`` (a tuning aid).

It runs ``batchfit.policy.search.search.search_and_confirm``, the function ``find_batch_size`` runs, with
real trials only (no fake-tensor forecast, as on CUDA; on a caching allocator the opening's
recorded allocator requests replayed at other sizes, as ``find`` does, unless ``--no-forecast``),
against each recorded case: a size that was
recorded answers with its recorded trial; one that was not, between two that fitted, with peaks
interpolated between theirs, and above a failure, with that failure (memory grows with the batch).
On the same trials it counts what doubling then bisection from 2 takes (Lightning's binsearch) and
accelerate's finder (from 512, 10% smaller after each failure), so a change to the policy is
judged on trials a real device ran, in seconds, on any machine. ``--set NAME=VALUE`` changes one
of the search's constants (a field of ``batchfit.policy.search.search_state.Tuning``: ``first_margin``,
``revisions``, ...) for the replay, which is handed that ``Tuning``.

The truth is the largest recorded size whose trials fit (on a caching allocator its confirming
trial too), which need not be below every failure: fitting is not always monotone there. Where
a recorded GPU case ran ``find`` without a forecast, the replay's sizes are checked against it:
they differ only where the device's outcome depended on what ran before.

Run: ``.venv/bin/python bench/find_replay.py bench/results/find-curves-cuda.json [more.json ...]
[--set first_margin=0.03]`` (well under a second per case).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from pathlib import Path

import _harness
from _recorded_trials import Recorded, load

from batchfit.policy.search.replay_forecast import ReplayForecast
from batchfit.policy.search.search import DEFAULT_TUNING, Candidates, Tuning, search_and_confirm
from batchfit.policy.search.trial import Trial
from batchfit.policy.search.trial_records import TrialRecords

#: Lightning's binsearch, as the benchmark runs it: from 2, at most 25 trials that fit.
LIGHTNING_START, LIGHTNING_MAX_TRIALS = 2, 25
#: accelerate's ``find_executable_batch_size``: from 512, times 0.9 after each failure.
ACCELERATE_START, ACCELERATE_FACTOR = 512, 0.9
#: What the benchmark's target asks of batchfit: at most half of Lightning's trials.
TARGET = 2.0
#: What ``--set`` changes: the search's constants, by their ``Tuning`` field (any case).
TUNABLE = tuple(constant.name for constant in fields(Tuning))


@dataclass
class Replay:
    answer: int | None
    sizes: list[int]
    steps: list[int | None]  # the steps each trial ran
    modelled: int  # of those, answered without a recorded trial
    seconds: float  # what its trials took when recorded


def replay_batchfit(recorded: Recorded, forecast: bool = True, tuning: Tuning = DEFAULT_TUNING) -> Replay:
    """``find``'s search on the recording, with ``tuning``; with ``forecast``, the recorded
    allocator requests of the trials that fitted so far, replayed at other sizes, place the
    confirming trials, as ``find`` does live."""
    recorded.modelled.clear()
    candidates = Candidates.between(1, recorded.max_batch_size)
    confirming: list[Trial] = []
    records = TrialRecords()  # added to as the search's trials run, as find's runners add

    def noted(trial: Trial) -> Trial:
        if trial.fits and trial.batch_size in recorded.records:
            records.add(recorded.records[trial.batch_size])
        return trial

    def short(batch_size: int) -> Trial:
        return noted(recorded.short(batch_size))

    def longer(batch_size: int) -> Trial:
        confirming.append(noted(recorded.long(batch_size)))
        return confirming[-1]

    confirm_steps = recorded.confirm_steps
    outcome = search_and_confirm(
        short,
        candidates,
        recorded.budget_bytes,
        longer=longer if confirm_steps else None,
        forecast=(
            ReplayForecast(records, recorded.budget_bytes, confirm_steps, recorded.soft_workspaces)
            if forecast and confirm_steps
            else None
        ),
        tuning=tuning,
    )
    sizes = [trial.batch_size for trial in outcome.trials]
    seconds = recorded.trial_seconds(list(outcome.trials), confirming)
    steps = [trial.steps for trial in outcome.trials]
    return Replay(outcome.batch_size, sizes, steps, len(recorded.modelled & set(sizes)), seconds)


def doubling_then_bisection(fits: Callable[[int], bool], start: int, upper: int) -> list[int]:
    """The sizes Lightning's binsearch tries: double while the trial fits, then bisect."""
    tried: list[int] = []
    low, high, size, fitted = 1, None, start, 0
    while True:
        tried.append(size)
        if fits(size):
            fitted += 1
            low = size
            if fitted > LIGHTNING_MAX_TRIALS or (high is not None and high - low <= 1):
                return tried
            following = (high + low) // 2 if high is not None else min(2 * size, upper)
            if following == size:
                return tried
            size = following
        else:
            high = size
            size = (high + low) // 2
            if high - low <= 1:
                return tried


def shrink_from_top(fits: Callable[[int], bool], start: int) -> list[int]:
    """The sizes accelerate's finder tries: from ``start``, 10% smaller after each failure."""
    tried, size = [], start
    while size > 0:
        tried.append(size)
        if fits(size):
            break
        size = int(size * ACCELERATE_FACTOR)
    return tried


def rows(
    curves: list[Recorded], forecast: bool = True, tuning: Tuning = DEFAULT_TUNING
) -> tuple[list[list[str]], bool]:
    lines, met = [], True
    for recorded in curves:
        ours = replay_batchfit(recorded, forecast, tuning)
        truth = recorded.truth()

        def fits(size: int, recorded: Recorded = recorded) -> bool:
            return recorded.short(size).fits

        lightning = doubling_then_bisection(fits, LIGHTNING_START, recorded.max_batch_size)
        accelerate = shrink_from_top(fits, min(ACCELERATE_START, recorded.max_batch_size))
        live = "-" if recorded.find_traces else ("yes" if recorded.find_sizes == ours.sizes else "NO")
        met = met and ours.answer == truth and len(lightning) >= TARGET * len(ours.sizes)
        lines.append(
            [
                recorded.name,
                recorded.cap,
                str(truth),
                str(ours.answer),
                "yes" if ours.answer == truth else "NO",
                str(len(ours.sizes)),
                str(ours.modelled),
                " ".join(map(str, ours.sizes)),
                live,
                f"{ours.seconds:.2f}",
                str(len(lightning)),
                _harness.ratio(len(lightning), len(ours.sizes)),
                _harness.ratio(recorded.trial_seconds([recorded.short(s) for s in lightning]), ours.seconds),
                str(len(accelerate)),
            ]
        )
    return lines, met


HEADERS = (
    "workload",
    "cap",
    "truth",
    "batchfit",
    "exact",
    "trials",
    "modelled",
    "sizes",
    "as find ran",
    "bf s",
    "binsearch",
    "L trials/bf",
    "L s/bf",
    "accelerate",
)


def apply_settings(settings: list[str], parser: argparse.ArgumentParser) -> Tuning:
    """The search's constants with each ``NAME=VALUE`` of ``settings`` in place of its default."""
    tuning = DEFAULT_TUNING
    for setting in settings:
        name, _, value = setting.partition("=")
        name = name.lower()
        if name not in TUNABLE or not value:
            parser.error(f"--set takes NAME=VALUE with NAME one of {', '.join(TUNABLE)}; got {setting!r}")
        kind = type(getattr(DEFAULT_TUNING, name))  # float, or int for a count
        try:
            tuning = replace(tuning, **{name: kind(value)})
        except ValueError:
            parser.error(
                f"--set {name} needs {'a whole number' if kind is int else 'a number'}; got {value!r}"
            )
    return tuning


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("curves", nargs="+", type=Path, help="files written by bench/find_curves.py")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument(
        "--no-forecast",
        action="store_true",
        help="search without replaying the opening's allocator requests (the search before it)",
    )
    args = parser.parse_args(argv)
    tuning = apply_settings(args.set, parser)
    for path in args.curves:
        if not path.is_file():
            parser.error(f"{path} does not exist: record it first with bench/find_curves.py")
    lines, met = rows(load(args.curves), forecast=not args.no_forecast, tuning=tuning)
    _harness.print_text_table(HEADERS, lines)
    verdict = "met" if met else "NOT met"
    print(f"\nexact, with at most 1/{TARGET:g} of binsearch's trials, in every case: {verdict}")
    print("(trials include the confirming one; 'modelled' of them were not recorded but interpolated;")
    print(" seconds are the recorded trials' own, binsearch's too: Lightning's overhead is not in them)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

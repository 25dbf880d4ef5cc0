"""Recorded trials and their replay (bench/find_curves.py, bench/find_replay.py): the replay runs
find's own policy on trials a real device ran, so the recording must be those trials and the
replay must take the path the live search takes."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from batchfit.policy.search.replay_forecast import ReplayForecast
from batchfit.policy.search.search import DEFAULT_TUNING, Candidates, search_and_confirm
from batchfit.policy.search.trial import Trial
from batchfit.policy.search.trial_records import TrialRecords
from batchfit.runtime.devices.caching_device import CONFIRM_STEPS
from batchfit.runtime.devices.resolve import resolve_device
from batchfit.runtime.steps.runner import TrialRunner, snapshot_scalers
from batchfit.runtime.steps.state import TrainingSnapshot
from batchfit.runtime.steps.stepping import StepSpec

# bench/ is a directory of scripts, not a package: its directory goes on the path.
BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
import _recorded_trials  # noqa: E402
import find_curves  # noqa: E402
import find_replay  # noqa: E402
from _capped import CPU_CACHING, STEPS_PER_TRIAL, Bench, Case  # noqa: E402

CASE = Case("mlp", "36.75MiB")


@pytest.fixture(scope="module")
def curve() -> find_curves.Curve:
    return find_curves.record(CASE, find_curves.torch.device("cpu"))


@pytest.fixture(scope="module")
def curve_file(curve: find_curves.Curve, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("curves") / "find-curves-cpu.json"
    path.write_text(json.dumps({"curves": [asdict(curve)]}))
    return path


def test_the_recording_is_real_trials_around_the_boundary(curve: find_curves.Curve) -> None:
    sizes = [point.batch_size for point in curve.points]
    assert sizes == sorted(set(sizes)) and sizes[0] == 1 and sizes[-1] == 512
    top = curve.largest_fitting
    assert top is not None and set(range(int(0.85 * top), int(1.12 * top) + 1)) <= set(sizes)
    assert all(point.short_seconds > 0 for point in curve.points)
    outcomes = {point.batch_size: point.short["outcome"] for point in curve.points}
    assert all(outcomes[s] == "ok" for s in sizes if s <= top)
    assert all(outcomes[s] == "oom" for s in sizes if s > top)
    peaks = [point.short["peak_bytes"] for point in curve.points if point.batch_size <= top]
    assert peaks == sorted(peaks) and peaks[-1] <= curve.budget_bytes  # memory grows with the batch
    assert curve.confirm_steps is None and all(point.long is None for point in curve.points)
    # find itself, on the same case, lands on the recorded boundary.
    assert curve.find_answer == top and curve.find_traces > 0


def test_the_replay_takes_the_live_search_s_path(curve: find_curves.Curve) -> None:
    # The live search without a forecast (as on CUDA), on the real capped device, from a fresh
    # workload: the replay of the recording must try the same sizes in the same order.
    bench = Bench(CASE, find_curves.torch.device("cpu"), curve.cap_bytes)
    workload, state = bench.workload()
    state.reset()
    target = resolve_device("cpu", bench.cap_bytes)
    snapshot = TrainingSnapshot.capture(
        workload.model, state.optimizer, (workload.train_step, workload.eval_step)
    )
    snapshot.set_gradients_aside()
    try:
        runner = TrialRunner.on(
            workload, target, "train", STEPS_PER_TRIAL, curve.budget_bytes, snapshot, None
        )
        live = search_and_confirm(runner.run, Candidates.between(1, 512), curve.budget_bytes)
    finally:
        snapshot.restore(gradients=True)
    replayed = find_replay.replay_batchfit(_recorded_trials.Recorded.from_dict(asdict(curve)))
    assert replayed.sizes == [t.batch_size for t in live.trials]
    assert replayed.answer == live.batch_size == curve.largest_fitting


def _recorded(
    fits_up_to: int, sizes: list[int], longs_fail: tuple[int, ...] = ()
) -> _recorded_trials.Recorded:
    def trial(size: int, steps: int, fits: bool) -> Trial:
        peak = 1000 + 10 * size
        return Trial(size, "ok" if fits else "oom", peak, 0.1 if fits else None, steps=steps)

    shorts = {s: trial(s, 2, s <= fits_up_to) for s in sizes}
    longs = {s: trial(s, 10, s not in longs_fail) for s in sizes if s <= fits_up_to and s >= fits_up_to // 2}
    return _recorded_trials.Recorded(
        "made", "1KiB", 1000 + 10 * fits_up_to, 512, 10, sizes, shorts, longs, [], None, 0
    )


def test_unrecorded_sizes_are_interpolated_or_fail_above_a_failure() -> None:
    recorded = _recorded(100, [1, 2, 4, 8, 16, 32, 64, *range(70, 116), 128, 256, 512])
    between = recorded.short(40)
    assert between.fits and between.peak_bytes == 1000 + 10 * 40 and between.batch_size == 40
    assert not recorded.short(300).fits and recorded.short(300).batch_size == 300
    assert recorded.modelled == {40, 300}
    assert recorded.long(50).fits and recorded.long(50).steps == 10  # below the longer trials
    gappy = _recorded(100, [1, 2, 4, 8, 16, 32, 64, 128])
    with pytest.raises(_recorded_trials.GapError, match="between 64 and 128"):
        gappy.short(100)


def test_the_truth_counts_the_confirming_trial() -> None:
    sizes = [1, 2, 4, 8, 16, 32, 64, *range(70, 116), 128]
    assert _recorded(100, sizes).truth() == 100
    assert _recorded(100, sizes, longs_fail=(99, 100)).truth() == 98
    replayed = find_replay.replay_batchfit(_recorded(100, sizes, longs_fail=(99, 100)))
    assert replayed.answer == 98  # the search found 100; its confirmation stepped down


def test_the_truth_is_the_largest_size_that_fits_where_fitting_is_not_monotone() -> None:
    # On a caching allocator a batch whose blocks fill the segments can fit where a smaller one
    # leaves holes (the mlp at 46 MiB: 384 fails, 512 trains): the truth is 512, not 256.
    recorded = _recorded(512, [1, 2, 4, 8, 16, 32, 64, 128, 256, 384, 512])
    recorded.shorts[384] = replace(recorded.shorts[384], outcome="oom", step_seconds=None)
    assert recorded.truth() == 512


@pytest.mark.parametrize(
    ("fits_up_to", "expected"),
    [
        # The ResNet-50 rows of docs/benchmarks.md: Lightning took 13 trials to 122 and 15 to 240.
        (122, [2, 4, 8, 16, 32, 64, 128, 96, 112, 120, 124, 122, 123]),
        (240, [2, 4, 8, 16, 32, 64, 128, 256, 192, 224, 240, 248, 244, 242, 241]),
        (1, [2]),
        (512, [2, 4, 8, 16, 32, 64, 128, 256, 512]),
    ],
)
def test_binsearch_tries_what_lightning_tries(fits_up_to: int, expected: list[int]) -> None:
    assert find_replay.doubling_then_bisection(lambda s: s <= fits_up_to, 2, 512) == expected


def test_accelerate_shrinks_from_the_top() -> None:
    assert find_replay.shrink_from_top(lambda s: s <= 400, 512) == [512, 460, 414, 372]


def test_the_cli_prints_the_table_and_refuses_what_it_cannot_use(curve_file: Path) -> None:
    script = BENCH / "find_replay.py"
    done = subprocess.run(
        [sys.executable, str(script), str(curve_file), "--set", "first_margin=0.05"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "mlp" in done.stdout and "exact, with at most 1/2 of binsearch's trials" in done.stdout
    plain = subprocess.run(
        [sys.executable, str(script), str(curve_file), "--no-forecast"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "mlp" in plain.stdout
    bad = subprocess.run(
        [sys.executable, str(script), str(curve_file), "--set", "SPEED=3"], capture_output=True, text=True
    )
    assert bad.returncode == 2 and "first_margin, max_margin, max_overhead" in bad.stderr
    missing = subprocess.run(
        [sys.executable, str(script), str(curve_file.with_name("none.json"))], capture_output=True, text=True
    )
    assert missing.returncode == 2 and "record it first with bench/find_curves.py" in missing.stderr


def test_settings_change_the_search_s_constants() -> None:
    parser = find_replay.argparse.ArgumentParser()
    tuning = find_replay.apply_settings(["FIRST_MARGIN=0.07", "revisions=0"], parser)
    assert tuning == replace(DEFAULT_TUNING, first_margin=0.07, revisions=0)
    assert DEFAULT_TUNING.first_margin == 0.02 and DEFAULT_TUNING.revisions == 2  # the defaults stand
    # The replay is handed them: on the H100's AMP trials, without the forecast, the line's first
    # aim is held 20% of the budget below it rather than 2%, and the answer stays; a replay handed
    # nothing after it aims by the defaults.
    recorded = _h100("resnet50-amp")
    held = find_replay.apply_settings(["first_margin=0.2"], parser)
    lower = find_replay.replay_batchfit(recorded, forecast=False, tuning=held)
    plain = find_replay.replay_batchfit(recorded, forecast=False)
    assert plain.sizes[:3] == [2, 4, 219] and lower.sizes[:4] == [2, 4, 187, 218]
    assert lower.answer == plain.answer == 241


def test_a_replay_s_seconds_are_the_recorded_trials_own() -> None:
    recorded = _recorded(100, [1, 2, 4, 8, 16, 32, 64, *range(85, 113), 128])
    recorded.seconds = {(s, False): s / 100 for s in recorded.sizes} | {(100, True): 5.0}
    trials = [recorded.short(2), recorded.short(40), recorded.long(100)]
    assert recorded.trial_seconds(trials, [trials[-1]]) == pytest.approx(0.02 + 0.32 + 5.0)  # 40: as 32 took
    assert recorded.trial_seconds(trials) == pytest.approx(0.02 + 0.32 + 1.0)  # 100 as a short trial
    replayed = find_replay.replay_batchfit(recorded)
    # The opening (2 and 4) runs short trials; each later one aims at the answer and confirms, and
    # an unrecorded confirming trial takes what the nearest recorded one took (100's 5 s).
    assert replayed.sizes[:2] == [2, 4] and len(replayed.sizes) > 2
    assert replayed.seconds == pytest.approx(0.02 + 0.04 + 5.0 * (len(replayed.sizes) - 2))
    assert replayed.steps == [2, 2] + [10] * (len(replayed.sizes) - 2)


def test_on_the_modelled_caching_allocator_the_replay_takes_the_live_path_with_its_confirming_steps() -> None:
    # CUDA's path on the CPU: a caching allocator, no fake-tensor forecast, the confirming trials
    # past the opening, placed by the opening's allocator requests replayed. The recording has the
    # longer trials and those requests, and the replay of find's policy on it tries the same
    # sizes, each as long, as the live search on the device.
    case = Case("cnn", "ref:32")
    curve = find_curves.record(case, find_curves.torch.device("cpu"), CPU_CACHING)
    assert curve.confirm_steps == CONFIRM_STEPS and any(point.long is not None for point in curve.points)
    points = {point.batch_size: point for point in curve.points}
    assert all(p.short["reserved_peak_bytes"] >= p.short["peak_bytes"] for p in points.values() if p.long)
    # Each confirming trial that fitted left its requests, cut to the opening's steps, for the
    # replay to be asked again on where its first answer failed.
    fitted = {str(size) for size, p in points.items() if p.long is not None and p.long["outcome"] == "ok"}
    assert fitted and set(curve.near_records) == fitted
    assert all(len(record["steps"]) == STEPS_PER_TRIAL + 1 for record in curve.near_records.values())
    bench = Bench(case, find_curves.torch.device("cpu"), curve.cap_bytes, CPU_CACHING)
    workload, state = bench.workload()
    state.reset()
    target = bench.target(bench.cap_bytes)
    snapshot = TrainingSnapshot.capture(
        workload.model, state.optimizer, (workload.train_step, workload.eval_step)
    )
    snapshot.set_gradients_aside()
    try:
        spec = StepSpec(
            workload,
            target,
            "train",
            STEPS_PER_TRIAL,
            cap_bytes=curve.budget_bytes,
            until_steady=True,
            record=True,
            scalers=snapshot_scalers(snapshot),
        )
        records = TrialRecords()  # one owner, handed to both runners and the replay, as find's are
        short = TrialRunner(spec, snapshot, records)
        confirmer = TrialRunner(replace(spec, steps=CONFIRM_STEPS), snapshot, records)
        live = search_and_confirm(
            short.run,
            Candidates.between(1, 512),
            curve.budget_bytes,
            longer=confirmer.run,
            forecast=ReplayForecast(records, curve.budget_bytes, CONFIRM_STEPS),
        )
    finally:
        snapshot.restore(gradients=True)
    recorded = _recorded_trials.Recorded.from_dict(asdict(curve))
    replayed = find_replay.replay_batchfit(recorded)
    assert replayed.sizes == [t.batch_size for t in live.trials] == curve.find_sizes
    assert sorted(curve.records) == ["1", "2", "3", "4"] and replayed.sizes[:2] == [2, 4]
    assert replayed.sizes[2:] == [recorded.truth(), (recorded.truth() or 0) + 1]  # placed by the replay
    # Without the forecast, the search the line places: more trials, the same answer.
    plain = find_replay.replay_batchfit(recorded, forecast=False)
    assert plain.answer == replayed.answer and len(plain.sizes) >= len(replayed.sizes)
    # Each trial as long as the live one: 2 steps, or a confirming trial ended where the modelled
    # allocator's state recurred (the same step on every run: the allocator is deterministic).
    assert replayed.steps == [t.steps for t in live.trials] == curve.find_steps
    assert any(t.steady_from is not None for t in live.trials)
    assert [t.steps for t in live.trials] == curve.find_steps
    assert CONFIRM_STEPS in curve.find_steps
    # Only a longer trial above the boundary is not recorded: it fails as its short trial did.
    assert all(points[size].short["outcome"] != "ok" for size in recorded.modelled)
    assert replayed.answer == live.batch_size == curve.find_answer == recorded.truth()


H100 = BENCH / "data" / "h100-2026-11-25"


class _Forecast:
    """A forecast whose boundary is set by hand."""

    def __init__(self, boundary: int) -> None:
        self.boundary = boundary

    def fits(self, batch_size: int) -> bool:
        return batch_size <= self.boundary

    def evidence(self) -> int:
        return self.boundary  # it never changes


def _h100(name: str) -> _recorded_trials.Recorded:
    files = {
        "resnet50-amp": "find-curves-cuda-resnet50-amp.json",
        "transformer": "find-curves-cuda-cnn-transformer.json",
    }
    (recorded,) = [r for r in _recorded_trials.load([H100 / files[name]]) if r.name == name]
    return recorded


def test_on_the_h100_s_amp_trials_the_opening_s_requests_forecast_every_verdict() -> None:
    # ResNet-50 AMP under 10.5 GiB on an H100: the requests of the trials at 2 and 4, replayed on
    # the modelled allocator, give the GPU's own 10-step verdict at every recorded size near the
    # boundary, and the search on those trials is 2, 4, the answer, the next.
    recorded = _h100("resnet50-amp")
    forecast = ReplayForecast(
        TrialRecords({size: recorded.records[size] for size in (2, 4)}),
        recorded.budget_bytes,
        recorded.confirm_steps,
        recorded.soft_workspaces,
    )
    near = list(range(218, 274))
    real = {size: recorded.long(size).fits if recorded.short(size).fits else False for size in near}
    assert [size for size in near if real[size]] == list(range(218, 242))
    assert {size: forecast.fits(size) for size in near} == real
    assert find_replay.replay_batchfit(recorded).sizes == [2, 4, 241, 242]


@pytest.mark.parametrize(
    ("name", "boundary", "expected", "answer"),
    [
        # The gallop's first step is a 32nd of the failed answer: a forecast one over that is not
        # asked again (as here) costs 3 more trials than a first step of 1 did (2, 4, 242, 241),
        # and one 4 over costs 2 fewer (it took 2, 4, 160, 159, 157, 153, 155, 156). find's own
        # forecast is asked again on the first size that fits (tests/policy/search/test_search.py).
        ("resnet50-amp", 242, [2, 4, 242, 234, 238, 240, 241], 241),
        ("resnet50-amp", 243, [2, 4, 243, 235, 239, 241, 242], 241),  # find.py's forecast on the H100
        ("transformer", 160, [2, 4, 160, 155, 157, 156], 156),  # the recording's own
    ],
)
def test_on_the_h100_s_trials_a_forecast_that_overshoots_is_followed_down(
    name: str, boundary: int, expected: list[int], answer: int
) -> None:
    # With the line alone after the failure these took 12 and 10 trials (AMP: 243, 219, 222, 223,
    # 233, 234, 238, 240, 241, 242), and the transformer answered 148 where 156 fits.
    recorded = _h100(name)
    outcome = search_and_confirm(
        recorded.short,
        Candidates.between(1, recorded.max_batch_size),
        recorded.budget_bytes,
        longer=recorded.long,
        forecast=_Forecast(boundary),
    )
    assert [trial.batch_size for trial in outcome.trials] == expected
    assert outcome.batch_size == answer

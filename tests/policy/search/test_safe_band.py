"""The band below a search's answer (``policy.search.safe_band``): every size the run may see up to the
answer checked to fit, on curves whose truth is known size by size (brute force), and on the H200's
recorded allocator requests against the H200's own scan, where fitting is not monotone."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from batchfit.policy.allocator.allocation_replay import Played
from batchfit.policy.search.safe_band import MAX_REPLAYED, SafeBand, Under, hold_below
from batchfit.policy.search.search_state import Candidates
from batchfit.policy.search.trial import Trial

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "bench"))
import _histories  # noqa: E402

from batchfit.policy.capacity.capacity_prediction import CapacityPredictor  # noqa: E402

SCAN = ROOT / "bench" / "data" / "h200-2026-11-26-2" / "find-cuda-smoke-builtins.json"
STEPS = 10  # the scan's steps a size, and the confirming trial's on CUDA


class Device:
    """A device whose every size's verdict is known (``fits``), each trial counted; its replay is
    ``replayed`` (the truth, unless told otherwise) with reserved bytes of ``reserved(size)``."""

    def __init__(
        self,
        fits: Callable[[int], bool],
        replayed: Callable[[int], bool] | None = None,
        reserved: Callable[[int], int] = lambda size: 100 * size,
    ) -> None:
        self.fits, self.replayed, self.reserved = fits, replayed or fits, reserved
        self.ran: list[int] = []

    def run(self, size: int) -> Trial:
        self.ran.append(size)
        fits = self.fits(size)
        return Trial(size, "ok" if fits else "oom", 100 * size, 0.1 if fits else None, steps=STEPS)

    def play(self, size: int, limit: int) -> Played:
        return Played(self.replayed(size), 100 * size, self.reserved(size))


def check(device: Device, answer: int, low: int = 1, step: int = 1, cap: int = 10**9) -> SafeBand:
    candidates = Candidates.between(step, 10_000, step)
    searched = (device.run(answer), device.run(answer + step))
    band, ran = hold_below(answer, low, candidates, searched, device.run, device.play, Under(cap, cap, STEPS))
    assert [trial.batch_size for trial in ran] == device.ran[2:]
    return band


def brute_force(fits: Callable[[int], bool], answer: int, low: int, step: int = 1) -> int | None:
    """The largest multiple of ``step`` from which down to ``low`` every size fits."""
    top = None
    for size in range(low, answer + 1):
        if not fits(size):
            break
        if size % step == 0:
            top = size
    return top


def test_a_monotone_curve_keeps_its_answer_and_runs_no_trial() -> None:
    device = Device(lambda size: size <= 500)
    band = check(device, 500)
    assert band == SafeBand(low=1, high=500, checked_to=1, replayed=499)
    assert device.ran == [500, 501]  # the search's two: every size below reserves less


@pytest.mark.parametrize("step", [1, 8])
@pytest.mark.parametrize("low", [1, 130])
def test_a_failing_band_below_the_answer_moves_it_to_the_top_of_the_band_below(low: int, step: int) -> None:
    def fits(size: int) -> bool:
        return size <= 140 or 148 <= size <= 156

    device = Device(fits)
    answer = 156 if step == 1 else 152
    band = check(device, answer, low, step)
    assert band.high == brute_force(fits, answer, low, step) == (140 if step == 1 else 136)
    assert band.isolated == answer and band.whole and band.failing == ((141, 147),)
    assert band.confirmed_at == (141, band.high)  # is the failure real; does the top hold


def test_where_the_replay_fails_a_size_that_fits_the_real_trial_decides() -> None:
    # The replay says 300-309 fail; the device fits them: each is run, up to the check's trials,
    # and where it runs out, the band stops below the lowest failure it has not refuted.
    device = Device(lambda size: size <= 400, replayed=lambda size: size <= 400 and not 300 <= size <= 301)
    band = check(device, 400)
    assert band.high == 400 and band.isolated is None and band.confirmed_at == (300, 301)
    stubborn = Device(lambda size: size <= 400, replayed=lambda size: size <= 400 and not 300 <= size <= 309)
    band = check(stubborn, 400)
    assert band.confirmed_at == (300, 301, 302, 303) and band.high == 303 and band.isolated == 400


def test_where_every_size_is_placed_the_one_reserving_most_beyond_the_answer_is_run() -> None:
    # 120 reserves more than the answer does (a request there takes a larger segment): the
    # replay's closest call, which a real trial confirms, or refutes and the band moves below it.
    def reserved(size: int) -> int:
        return 100 * size + (20_000 if 118 <= size <= 122 else 0)

    holds = Device(lambda size: size <= 150, reserved=reserved)
    assert check(holds, 150).confirmed_at == (122,)
    fails = Device(lambda size: size <= 150 and size != 122, lambda size: size <= 150, reserved)
    band = check(fails, 150)
    assert band.confirmed_at == (122, 121) and band.high == 121 and band.failing == ((122, 122),)


def test_the_replay_stops_at_its_limit_and_says_how_far_it_reached() -> None:
    device = Device(lambda size: size <= 5000)
    band = check(device, 5000)
    assert band.checked_to == 5000 - MAX_REPLAYED and not band.whole and band.high == 5000


def test_the_memory_fraction_that_holds_the_isolated_answer_is_the_replays() -> None:
    # Each size fits where the cap holds its reserved bytes, but 141-144 reserve 30% more.
    def reserved(size: int) -> int:
        return 1000 * size * (13 if 141 <= size <= 144 else 10) // 10

    capacity = 250_000

    class Capped(Device):
        def play(self, size: int, limit: int) -> Played:
            return Played(reserved(size) <= limit, 0, reserved(size))

    device = Capped(lambda size: reserved(size) <= 160_000)
    searched = (device.run(156), device.run(157))
    candidates = Candidates.between(1, 500)
    band, _ = hold_below(
        156, 1, candidates, searched, device.run, device.play, Under(160_000, capacity, STEPS)
    )
    assert band.high == 140 and band.failing == ((141, 144),)
    # 144 reserves 187,200 bytes: 0.75 x 250,000 is the first hundredth above it.
    assert band.memory_fraction_for_isolated == pytest.approx(0.75)


def _h200(workload: str) -> tuple[dict[int, bool], int]:
    rows = json.loads(SCAN.read_text())["rows"]
    row = next(row for row in rows if row["case"]["workload"] == workload)
    return {int(size): fit for size, fit in row["truth"]["fits"].items()}, int(row["cap_bytes"])


@pytest.mark.parametrize(
    ("workload", "answer", "high", "failing"),
    [
        ("transformer", 156, 140, ((141, 144), (149, 152))),
        ("mlp", 543, 493, ((494, 512),)),
    ],
)
def test_on_the_h200s_recorded_requests_the_band_is_the_scans(
    workload: str, answer: int, high: int, failing: tuple[tuple[int, int], ...]
) -> None:
    # The scan's sizes fit and fail as the H200 measured them (10 steps each); the replay plays the
    # H200's recorded requests at 2, 4 and 8 as predict does. From the scan's lowest size up to the
    # top of its highest fitting band (the answer find gave there), the check lands where the scan
    # says every smaller size fits, in two real trials: the lowest failure, then the top below it.
    truth, cap = _h200(workload)
    assert truth[answer] and not truth[answer + 1]
    histories = _histories.histories(workload)
    records = {size: _histories.record_of(history) for size, history in histories.items()}
    replay = CapacityPredictor(records, STEPS, soft_workspaces=True).replays[0][1]
    device = Device(truth.__getitem__)

    def play(size: int, limit: int) -> Played:
        played = replay.play(size, limit, STEPS, True)
        assert played is not None
        return played

    low = min(truth)
    searched = (device.run(answer), device.run(answer + 1))
    candidates = Candidates.between(1, 1024)
    band, ran = hold_below(answer, low, candidates, searched, device.run, play, Under(cap, cap, STEPS))
    assert band.high == high == brute_force(truth.__getitem__, answer, low)
    assert band.failing == failing and band.isolated == answer and band.whole
    assert [trial.batch_size for trial in ran] == [failing[0][0], high]

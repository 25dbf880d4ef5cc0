"""The band below a search's answer: every size from the smallest batch the run will see up to the
answer, checked to fit, so that a last batch, an eval batch or a restart at a smaller size does not
run out of memory where the larger answer fitted.

Behind a caching allocator which sizes fit is not monotone in the batch: a request that crosses a
segment's size takes a segment of another size, and a smaller batch can reserve more than a larger
one (CUDA's 20 MiB segments for requests up to 10 MiB, against a segment rounded to 2 MiB above).
The check replays the recorded requests (``policy.search.replay_forecast``) at every size below the answer,
from the answer down (milliseconds a size), and runs real trials only where the replay decides
something: at its lowest failing size (is the failure real?), at the top of the band below it (does
that hold?), and, where every size is placed, at the size whose replay reserves the most beyond what
the answer's does (the one closest to failing). Real trials decide; the replay places them.

Torch-free: ``find`` passes the replay and its confirming trial (``run``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from batchfit.policy.allocator.allocation_replay import Played
from batchfit.policy.search.search_state import Candidates
from batchfit.policy.search.trial import Trial

#: The most sizes below the answer the replay plays (from the answer down): behind that the check
#: says how far down it reached. A size takes 0.2-10 ms to replay (an MLP's requests to
#: ResNet-50's, 10 steps), so this bounds the check to seconds, beside trials of seconds on a GPU.
MAX_REPLAYED = 4096
#: The most real trials the check runs: each one it runs either confirms the band or moves it down.
MAX_TRIALS = 4
#: How finely the memory fraction that would hold the isolated answer's band is placed.
FRACTION_STEP = 0.01

Play = Callable[[int, int], "Played | None"]  # (batch size, limit in bytes) -> the replay's verdict


@dataclass(frozen=True)
class SafeBand:
    """Every size from ``low`` to ``high`` fits: replayed down to ``checked_to`` (``low`` where the
    replay reached it), confirmed by the real trials at ``confirmed_at``. Where sizes between ``high``
    and the search's answer fail (``failing``: inclusive runs), that answer is ``isolated``: it fits,
    but a smaller batch of the run may not; ``memory_fraction_for_isolated`` is the share of the
    device at which the replay places every size up to it (None: none up to the whole device)."""

    low: int
    high: int | None  # None: even the smallest size checked fails
    checked_to: int
    replayed: int
    confirmed_at: tuple[int, ...] = ()
    failing: tuple[tuple[int, int], ...] = ()
    isolated: int | None = None
    memory_fraction_for_isolated: float | None = None
    isolated_by_replay: bool = False  # the isolated size is the replay's, above the answer: no trial ran it

    @property
    def whole(self) -> bool:
        """Whether the replay reached the smallest size the run will see."""
        return self.checked_to <= self.low


@dataclass(frozen=True)
class Under:
    """What the band is checked under: the budget the replay plays each size against
    (``limit_bytes``), the device's whole memory, of which the fraction that would hold an isolated
    answer is a share (``capacity_bytes``), and the steps a real trial runs to confirm a fit."""

    limit_bytes: int
    capacity_bytes: int
    steps: int


@dataclass
class _BandCheck:
    """One check's evidence: what real trials said at each size (a failure at any step count is a
    failure; a fit counts once it ran the confirming steps), and the trials it ran itself."""

    answer: int
    low: int
    steps: int
    known: dict[int, bool] = field(default_factory=dict)
    ran: list[Trial] = field(default_factory=list)
    # The replay's verdicts, each played once: a trial the check runs decides its own size, and the
    # records it adds would move the replay's verdicts elsewhere less than the trials decide them.
    played: dict[int, Played | None] = field(default_factory=dict)

    def learn(self, trial: Trial) -> None:
        if not trial.fits:
            self.known[trial.batch_size] = False
        elif self.known.get(trial.batch_size) is not False and _confirmed(trial, self.steps):
            self.known[trial.batch_size] = True

    def run(self, run: Callable[[int], Trial], batch_size: int) -> None:
        trial = run(batch_size)
        self.ran.append(trial)
        self.learn(trial)

    def play(self, play: Play, size: int, limit: int) -> Played | None:
        if size not in self.played:
            self.played[size] = play(size, limit)
        return self.played[size]


def hold_below(
    answer: int,
    low: int,
    candidates: Candidates,
    trials: Sequence[Trial],
    run: Callable[[int], Trial],
    play: Play | None,
    under: Under,
    above: int | None = None,
) -> tuple[SafeBand, tuple[Trial, ...]]:
    """The band of every size from ``low`` up to ``answer`` (a search's, run and fitted) that fits,
    and the real trials the check ran with ``run`` (``under.steps`` steps each). ``play(size,
    limit)`` is the replay (None: no records to replay; real trials alone then); ``trials``: the
    search's; ``above``: a larger size the replay places above sizes that fail (the search's
    forecast saw it and aimed below), reported as the isolated size where the band holds the answer."""
    check = _BandCheck(answer, low, under.steps)
    for trial in trials:
        check.learn(trial)
    check.known[answer] = True
    while True:
        verdicts, peaks = _verdicts(check, play, under.limit_bytes)
        failing = sorted(size for size, fits in verdicts.items() if not fits)
        room = len(check.ran) < MAX_TRIALS
        if not failing:
            closest = _closest_to_failing(check, peaks)
            if closest is not None and room:
                check.run(run, closest)
                continue
            band = _band(check, verdicts, None, candidates)
            if above is not None and play is not None and above > answer:
                band = _above(band, check, play, above, under)
            return band, tuple(check.ran)
        lowest = failing[0]
        if lowest not in check.known and room:  # the replay's failure: is it real?
            check.run(run, lowest)
            continue
        top = _top_below(lowest, low, candidates)
        if top is not None and check.known.get(top) is not True:  # the answer is a trial that ran
            check.run(run, top)
            continue
        band = _band(check, verdicts, top, candidates)
        if band.isolated is not None and play is not None:
            fraction = _fraction_holding(band, play, under)
            band = replace(band, memory_fraction_for_isolated=fraction)
        return band, tuple(check.ran)


def band_top(fits: Callable[[int], bool | None], answer: int, low: int, candidates: Candidates) -> int:
    """The largest candidate up to ``answer`` below which the replay (``fits``) places every size
    down to ``low`` (at most ``MAX_REPLAYED`` of them): where a saved prediction puts a search's
    first trial, so that it aims at the band the check below the answer keeps; ``answer`` where
    nothing below it fails, or no candidate lies below the lowest failure."""
    failing = [
        size for size in range(answer - 1, max(low, answer - MAX_REPLAYED) - 1, -1) if fits(size) is False
    ]
    if not failing:
        return answer
    top = _top_below(min(failing), low, candidates)
    return answer if top is None else top


def _confirmed(trial: Trial, steps: int) -> bool:
    """A trial that fitted ran the confirming steps, or ended early where its steps repeated."""
    return trial.steady_from is not None or (trial.steps or 0) >= steps


def _verdicts(check: _BandCheck, play: Play | None, limit: int) -> tuple[dict[int, bool], dict[int, int]]:
    """Each size below the answer, from the answer down to ``low`` (at most ``MAX_REPLAYED`` of them):
    the real trial's verdict where one ran, else the replay's; and the replay's reserved peak at each
    size it placed, the answer's too."""
    verdicts: dict[int, bool] = {}
    peaks: dict[int, int] = {}
    for size in range(check.answer, max(check.low, check.answer - MAX_REPLAYED) - 1, -1):
        played = None if play is None else check.play(play, size, limit)
        if played is not None:
            peaks[size] = played.peak_reserved_bytes
        if size == check.answer:
            continue
        if size in check.known:
            verdicts[size] = check.known[size]
        elif played is not None:
            verdicts[size] = played.fits
    if play is None:  # the real trials alone, down to the smallest size the run sees
        verdicts |= {size: fits for size, fits in check.known.items() if check.low <= size < check.answer}
    return verdicts, peaks


def _closest_to_failing(check: _BandCheck, peaks: dict[int, int]) -> int | None:
    """The size below the answer whose replay reserves the most, where that is more than the
    answer's replay reserves: the replay's nearest call, once a real trial has not confirmed it
    (the sizes that reserve less are then held by it). None where every size reserves at most what
    the answer does (the answer's own trial covers them)."""
    ceiling = peaks.get(check.answer)
    above = [(peak, size) for size, peak in peaks.items() if size < check.answer and peak > (ceiling or 0)]
    if ceiling is None or not above:
        return None
    closest = max(above)[1]
    return None if closest in check.known else closest


def _top_below(failing: int, low: int, candidates: Candidates) -> int | None:
    """The largest candidate below a failing size and at least ``low`` (None: none)."""
    index = candidates.index_at_most(failing - 1)
    if index < 0:
        return None
    top = candidates.batch(index)
    return top if top >= low else None


def _band(check: _BandCheck, verdicts: dict[int, bool], top: int | None, candidates: Candidates) -> SafeBand:
    """The band as the evidence stands: ``top`` below the lowest failure (None where nothing fails:
    the answer itself)."""
    checked = [size for size in verdicts] or [check.answer]
    confirmed = tuple(trial.batch_size for trial in check.ran)
    replayed = sum(1 for size in verdicts if size not in check.known)
    if top is None and not any(not fits for fits in verdicts.values()):
        return SafeBand(check.low, check.answer, min(checked), replayed, confirmed)
    failing = sorted(size for size, fits in verdicts.items() if not fits and (top is None or size > top))
    return SafeBand(check.low, top, min(checked), replayed, confirmed, _runs(failing), check.answer)


def _above(band: SafeBand, check: _BandCheck, play: Play, above: int, under: Under) -> SafeBand:
    """The band that holds the answer, with the replay's larger size above it where sizes between
    them fail: the isolated size, by the replay alone."""
    between = range(check.answer + 1, min(above, check.answer + MAX_REPLAYED))
    failing = [
        size
        for size in between
        if (played := check.play(play, size, under.limit_bytes)) is not None and not played.fits
    ]
    if not failing:
        return band
    isolated = replace(band, failing=_runs(failing), isolated=above, isolated_by_replay=True)
    return replace(isolated, memory_fraction_for_isolated=_fraction_holding(isolated, play, under))


def _runs(sizes: list[int]) -> tuple[tuple[int, int], ...]:
    """Sorted sizes as inclusive runs of consecutive ones: [141, 142, 149] -> ((141, 142), (149, 149))."""
    runs: list[tuple[int, int]] = []
    for size in sizes:
        if runs and runs[-1][1] == size - 1:
            runs[-1] = (runs[-1][0], size)
        else:
            runs.append((size, size))
    return tuple(runs)


def _fraction_holding(band: SafeBand, play: Play, under: Under) -> float | None:
    """The smallest share of ``under.capacity_bytes`` (in steps of ``FRACTION_STEP``) at which the
    replay places the isolated answer and every failing size below it; None where the whole device
    does not."""
    sizes = [size for first, last in band.failing for size in range(first, last + 1)]
    sizes.append(band.isolated or 0)

    def holds(fraction_steps: int) -> bool:
        cap = int(fraction_steps * FRACTION_STEP * under.capacity_bytes)
        return all((played := play(size, cap)) is not None and played.fits for size in sizes)

    low, high = int(under.limit_bytes / under.capacity_bytes / FRACTION_STEP), round(1 / FRACTION_STEP)
    if holds(low) or not holds(high):  # the replay does not see the failure, or nothing holds
        return None
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if holds(middle) else (middle, high)
    return high * FRACTION_STEP

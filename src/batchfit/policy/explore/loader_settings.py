"""The data-loading check's decisions, free of torch: whether the loader holds training back, which
DataLoader settings to try (over an injected ``measure(setting) -> SettingRow``), and which to
recommend: the cheapest within ``tolerance`` of the fastest measured."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from batchfit.checks import check_flag, check_positive_int, check_positive_number, option
from batchfit.errors import ConfigurationError

#: Above this share of a training step spent waiting for data, the loader is the bottleneck. Below
#: it, a faster loader gains less than a tenth of the step time, which is within what the wait
#: itself costs at best (the queue hand-off and the host-to-device copy stay), so it is not worth a
#: setting change.
WAIT_SHARE_THRESHOLD = 0.10
#: The DataLoader's own prefetch_factor with workers (batches loaded ahead per worker).
DEFAULT_PREFETCH_FACTOR = 2
#: Tried beside the default at the best worker count: a deeper queue evens out slow items.
PREFETCH_FACTORS = (4,)
#: The knobs a loader factory may accept, in the order they are tried.
KNOBS = ("num_workers", "prefetch_factor", "pin_memory", "persistent_workers")

DataCheckStopReason = Literal[
    "not_bottleneck", "no_wait_left", "slower_with_more_workers", "exhausted", "time_budget"
]


@dataclass(frozen=True)
class LoaderSetting:
    """The DataLoader keywords the check measures; ``prefetch_factor=None`` is the DataLoader's
    default (2 with workers, nothing without)."""

    num_workers: int = field(default=0, metadata={"help": "the setting used now"})
    pin_memory: bool = field(default=False, metadata={"help": "the setting used now pins memory"})
    persistent_workers: bool = field(
        default=False, metadata={"help": "the setting used now keeps its workers"}
    )
    prefetch_factor: int | None = field(
        default=None, metadata={"help": "the setting used now (default: the DataLoader's)"}
    )

    def check(self) -> None:
        if (
            isinstance(self.num_workers, bool)
            or not isinstance(self.num_workers, int)
            or self.num_workers < 0
        ):
            raise ConfigurationError(f"num_workers must be an integer >= 0, got {self.num_workers!r}.")
        check_flag("pin_memory", self.pin_memory)
        check_flag("persistent_workers", self.persistent_workers)
        if self.prefetch_factor is not None and (
            isinstance(self.prefetch_factor, bool)
            or not isinstance(self.prefetch_factor, int)
            or self.prefetch_factor < 1
        ):
            raise ConfigurationError(
                f"prefetch_factor must be a positive integer or None, got {self.prefetch_factor!r}."
            )
        if self.num_workers == 0 and (self.persistent_workers or self.prefetch_factor is not None):
            knob = "persistent_workers=True" if self.persistent_workers else "prefetch_factor"
            raise ConfigurationError(
                f"{knob} needs num_workers > 0 (the DataLoader refuses it without workers); "
                f"pass num_workers >= 1 or leave {knob.split('=')[0]} at its default."
            )

    @property
    def effective_prefetch_factor(self) -> int:
        """Batches loaded ahead per worker (0 without workers)."""
        if self.num_workers == 0:
            return 0
        return DEFAULT_PREFETCH_FACTOR if self.prefetch_factor is None else self.prefetch_factor

    def cost(self) -> tuple[int, bool, int, bool]:
        """What a setting costs, compared in this order: workers (processes and memory), pinned
        memory, batches held ahead, processes kept between epochs. The defaults cost least."""
        return (self.num_workers, self.pin_memory, self.effective_prefetch_factor, self.persistent_workers)

    def describe(self) -> str:
        """``num_workers=2, prefetch_factor=4``: num_workers, then what is not the default."""
        words = [f"num_workers={self.num_workers}"]
        if self.prefetch_factor is not None and self.prefetch_factor != DEFAULT_PREFETCH_FACTOR:
            words.append(f"prefetch_factor={self.prefetch_factor}")
        words += [f"{knob}=True" for knob in ("pin_memory", "persistent_workers") if getattr(self, knob)]
        return ", ".join(words)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class SettingRow:
    """One setting measured as training runs it: the loader feeding real steps."""

    setting: LoaderSetting
    samples_per_second: float
    data_wait_share: float  # of the loop's time, in next(iterator) and the host-to-device copy
    startup_seconds: float  # from iter(loader) to the first batch: the workers' start, once per epoch

    def to_dict(self) -> dict[str, Any]:
        return {**self.setting.to_dict(), **{k: v for k, v in asdict(self).items() if k != "setting"}}


def check_tolerance(tolerance: object) -> None:
    if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or not 0 <= tolerance < 1:
        raise ConfigurationError(f"tolerance={tolerance!r} must be in [0, 1), e.g. 0.03 for 3%.")


@dataclass(frozen=True)
class LoaderSearch:
    """How the data check measures and how far it searches: the setting used now (its start), each
    pass's length, the most workers to try, and what counts as as fast as the best (the time allowed
    is ``Timing``'s)."""

    current: LoaderSetting = option(LoaderSetting(), "the setting used now, the search's start", cli=False)
    max_num_workers: int | None = option(
        None, "the most workers to try (default: the cores this process may use)"
    )
    tolerance: float = option(0.03, "within this of the best counts as as fast")
    window_seconds: float = option(1.0, "the timed length of each pass")

    def __post_init__(self) -> None:
        if not isinstance(self.current, LoaderSetting):
            raise ConfigurationError(
                f"LoaderSearch.current must be a LoaderSetting, got {type(self.current).__name__} "
                f"({self.current!r}); pass current=LoaderSetting(num_workers=...)."
            )
        check_tolerance(self.tolerance)
        check_positive_number("window_seconds", self.window_seconds)
        if self.max_num_workers is not None:
            check_positive_int("max_num_workers", self.max_num_workers, minimum=0)


def is_bottleneck(data_wait_share: float) -> bool:
    return data_wait_share > WAIT_SHARE_THRESHOLD


def worker_ladder(max_num_workers: int) -> tuple[int, ...]:
    """0, 1, 2, 4, 8, ... up to ``max_num_workers``, which ends it when it is not a power of two."""
    ladder, workers = [0], 1
    while workers <= max_num_workers:
        ladder.append(workers)
        workers *= 2
    if ladder[-1] != max_num_workers:
        ladder.append(max_num_workers)
    return tuple(ladder)


def with_workers(setting: LoaderSetting, num_workers: int) -> LoaderSetting:
    """``setting`` at another worker count: the knobs that need workers are dropped at 0."""
    if num_workers == 0:
        return replace(setting, num_workers=0, prefetch_factor=None, persistent_workers=False)
    return replace(setting, num_workers=num_workers)


def try_settings(
    current: SettingRow,
    measure: Callable[[LoaderSetting], SettingRow],
    *,
    max_num_workers: int,
    knobs: Sequence[str],
    cuda: bool,
    tolerance: float,
    fits: Callable[[LoaderSetting, Sequence[SettingRow]], bool] = lambda setting, rows: True,
) -> tuple[tuple[SettingRow, ...], DataCheckStopReason]:
    """Every setting measured (``current`` first), and why the trying stopped.

    ``num_workers`` climbs ``worker_ladder`` and stops once a rung's data wait is within
    ``tolerance`` (no more than that is left to gain) or a rung is slower than a lower rung by more
    than ``tolerance`` (more workers only contend for the cores). At the fastest worker count,
    if above 0: ``prefetch_factor`` in ``PREFETCH_FACTORS``, then ``pin_memory=True`` on CUDA (on
    the CPU there is no copy for it to speed up). Only the ``knobs`` the loader accepts are varied;
    ``fits(setting, rows)`` is asked before each measurement (the rows so far), and a ``False`` ends
    the trying (``"time_budget"``).
    """
    rows = [current]
    measured = {current.setting: current}

    def fastest() -> LoaderSetting:
        return max(rows, key=lambda row: row.samples_per_second).setting

    def run(setting: LoaderSetting) -> SettingRow | None:
        if setting not in measured:
            if not fits(setting, tuple(rows)):
                return None
            measured[setting] = measure(setting)
            rows.append(measured[setting])
        return measured[setting]

    stop: DataCheckStopReason = "exhausted"
    if "num_workers" in knobs:
        climbed = 0.0  # the fastest rung so far
        for workers in worker_ladder(max_num_workers):
            row = run(with_workers(current.setting, workers))
            if row is None:
                return tuple(rows), "time_budget"
            if row.data_wait_share <= tolerance:
                stop = "no_wait_left"
                break
            if row.samples_per_second < (1 - tolerance) * climbed:
                stop = "slower_with_more_workers"
                break
            climbed = max(climbed, row.samples_per_second)
    if fastest().num_workers > 0 and "prefetch_factor" in knobs:
        base = fastest()
        for factor in PREFETCH_FACTORS:
            if run(replace(base, prefetch_factor=factor)) is None:
                return tuple(rows), "time_budget"
    pin = cuda and "pin_memory" in knobs and not fastest().pin_memory
    if pin and run(replace(fastest(), pin_memory=True)) is None:
        return tuple(rows), "time_budget"
    return tuple(rows), stop


@dataclass(frozen=True)
class LoaderRecommendation:
    """The setting to train with, its measured row, and the current setting's row to compare."""

    setting: LoaderSetting
    row: SettingRow  # the measured row (persistent_workers is not measured: see startup_share)
    current: SettingRow
    startup_share: float | None  # of an epoch, the workers' start that persistent_workers saves

    @property
    def gain(self) -> float:
        """The recommended setting's samples/s over the current one's, both measured."""
        return self.row.samples_per_second / self.current.samples_per_second

    def summary(self) -> str:
        now, after = self.current, self.row
        if self.setting == now.setting:
            return (
                f"keep {now.setting.describe()}: no setting tried is faster by more than the tolerance; "
                f"the loading itself must get faster (the dataset's __getitem__, its transforms, "
                f"its storage), or the step slower (a larger batch)."
            )
        text = (
            f"use {self.setting.describe()}: {self.gain:.2f}x the samples/s measured "
            f"({now.samples_per_second:.1f} -> {after.samples_per_second:.1f}), the data wait "
            f"{now.data_wait_share:.0%} -> {after.data_wait_share:.0%} of each step"
        )
        added = self.setting.persistent_workers and not now.setting.persistent_workers
        if added and self.startup_share is not None:
            text += (
                f"; persistent_workers=True keeps the workers between epochs, saving their start "
                f"(about {self.startup_share:.0%} of an epoch)"
            )
        return text + "."

    def to_dict(self) -> dict[str, Any]:
        return {
            "setting": self.setting.to_dict(),
            "samples_per_second": self.row.samples_per_second,
            "data_wait_share": self.row.data_wait_share,
            "gain": self.gain,
            "startup_share": self.startup_share,
            "summary": self.summary(),
        }


def startup_share(row: SettingRow, batch_size: int, batches_per_epoch: int | None) -> float | None:
    """The share of an epoch ``row``'s setting spends starting its workers, which
    persistent_workers saves: the measured start less one batch's loading (each epoch's first
    batch waits for it anyway, taken as one worker's share of the time at the measured rate, an
    overestimate, so the saving is not overstated). None without workers or an epoch length."""
    workers = row.setting.num_workers
    if workers == 0 or not batches_per_epoch or row.samples_per_second <= 0:
        return None
    batch_seconds = batch_size / row.samples_per_second
    saving = max(0.0, row.startup_seconds - workers * batch_seconds)
    return saving / (saving + batches_per_epoch * batch_seconds)


def recommend(
    current: SettingRow,
    rows: Sequence[SettingRow],
    *,
    tolerance: float,
    batch_size: int,
    batches_per_epoch: int | None = None,
    knobs: Sequence[str] = KNOBS,
) -> LoaderRecommendation | None:
    """None when ``current`` is not the bottleneck. Else the cheapest measured setting (fewest
    workers, then the defaults: ``LoaderSetting.cost``) whose samples/s are within ``tolerance`` of
    the fastest; with ``persistent_workers=True`` when it is accepted and the workers' start would
    cost more than ``tolerance`` of an epoch (or the current setting has it already)."""
    check_tolerance(tolerance)
    if not is_bottleneck(current.data_wait_share):
        return None
    best = max((current, *rows), key=lambda row: row.samples_per_second).samples_per_second
    within = [row for row in (current, *rows) if row.samples_per_second >= (1 - tolerance) * best]
    chosen = min(within, key=lambda row: row.setting.cost())
    share = startup_share(chosen, batch_size, batches_per_epoch)
    keep = chosen.setting.num_workers > 0 and (
        current.setting.persistent_workers
        or ("persistent_workers" in knobs and share is not None and share > tolerance)
    )
    return LoaderRecommendation(replace(chosen.setting, persistent_workers=keep), chosen, current, share)

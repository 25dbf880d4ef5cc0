"""``advise``: the checklist, run on the user's model: find (train and eval), explore, compare and,
given data, check_data, then what to change ranked by its measured gain, with the plan's
learning rate and warm-up for the batch it recommends."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from typing_extensions import Unpack

from batchfit.advice.advice_result import Advice
from batchfit.checks import check_option, check_positive_int, shown, type_name
from batchfit.comparison.compare import compare_on
from batchfit.comparison.comparison import Comparison
from batchfit.data_check.check_data import CHECK_DATA_TIMING, DataCheck, check_data
from batchfit.errors import ConfigurationError
from batchfit.exploration.explore import explore_on
from batchfit.exploration.explore_result import ExploreResult
from batchfit.options import BatchSizes, Goal, Timing, Where
from batchfit.policy.explore.advice import Change, costly, noisy, rank, slower
from batchfit.policy.explore.time_budget import NotMeasured, TimeBudget
from batchfit.policy.noise.goodput import noise_scale_of
from batchfit.policy.noise.noise_scale import NoiseScale
from batchfit.policy.plan.plan import Plan, plan
from batchfit.policy.plan.plan_options import Baseline, Scaling, TrainingFacts
from batchfit.policy.search.trial import Mode
from batchfit.progress import Event, OnProgress, tell
from batchfit.runtime.data.dataloaders import LoaderFactory
from batchfit.runtime.workloads.entry import check_entry
from batchfit.runtime.workloads.workload import Workload
from batchfit.search.find_batch_size import find_on
from batchfit.search.search_result import SearchResult
from batchfit.where import ResolvedDevice, WhereShorthand, target_of

#: The steps advise runs, in order; each can be skipped.
STEPS = ("find", "explore", "compare", "check-data", "plan")


#: advise's timing unless told: the whole checklist's budget, which keeps the README's example (the
#: cnn under a 256 MiB cap) to a few minutes on 2 CPU cores, with or without bfloat16 kernels.
ADVISE_TIMING = Timing(time_budget_seconds=240.0)
#: explore's share of what is left after find, and at most this many seconds.
EXPLORE_SHARE = 0.15
EXPLORE_SECONDS = 30.0
#: compare's estimated cost: this many times find's train search (the baseline's search again,
#: the probes and the speed rounds); compare keeps its own budget, a share of what is left.
COMPARE_SEARCHES = 2.0
COMPARE_SHARE = 0.8
#: check-data starts only with this many seconds left (its loader search times a few windows).
CHECK_DATA_SECONDS = 10.0


@dataclass(frozen=True)
class Checklist:
    """Which of advise's steps run, and what they are given: the steps to ``skip``, the
    ``batch_size`` to check data and plan at (default: explore's recommendation, else find's
    largest), compare's ``techniques`` (None: the defaults), check-data's ``loader`` (a factory
    or its ``module:function`` spec; None: the workload's dataset) and the gradient
    ``noise_scale`` (a number of samples or a measured ``NoiseScale``) that adds goodput to explore
    and how far scaling pays to the plan."""

    skip: tuple[str, ...] = ()
    batch_size: int | None = None
    techniques: tuple[str, ...] | None = None
    loader: LoaderFactory | str | None = None
    noise_scale: float | NoiseScale | None = None

    def __post_init__(self) -> None:
        for name in ("skip", "techniques"):
            value = getattr(self, name)
            if isinstance(value, str) or not (value is None or isinstance(value, (tuple, list))):
                example = "('compare',)" if name == "skip" else "('amp', 'checkpointing')"
                raise ConfigurationError(
                    f"Checklist.{name} must be a tuple of names, got {type_name(value)} ({shown(value)}); "
                    f"pass {name}={example}."
                )
        unknown = [step for step in self.skip if step not in STEPS]
        if unknown:
            raise ConfigurationError(f"skip {unknown}: the steps are {', '.join(STEPS)}.")
        if self.batch_size is not None:
            check_positive_int("batch_size", self.batch_size)
        if self.noise_scale is not None:
            noise_scale_of(self.noise_scale)


def advise(
    workload: Workload,
    *,
    where: Where | None = None,
    sizes: BatchSizes = BatchSizes(),
    timing: Timing = ADVISE_TIMING,
    checklist: Checklist = Checklist(),
    baseline: Baseline | None = None,
    on_progress: OnProgress | None = None,
    **shorthand: Unpack[WhereShorthand],
) -> Advice:
    """Run the checklist on ``workload``: ``find`` (train and eval, in ``sizes``), ``explore``
    (with ``timing``), ``compare``, ``check-data`` (when the workload has a dataset or the
    checklist a loader) and ``plan`` (with ``baseline``, the run the learning rate was tuned on:
    the learning rate and warm-up for ``sizes.global_batch_size``, by default the recommended
    batch x ``sizes.world_size``, by the scaling rule of the workload's optimizer), each unless
    ``checklist.skip`` names it; a step starts only if its estimated cost fits in what is left of
    ``timing.time_budget_seconds`` (the whole checklist's; 0: no bound), else ``not_measured``
    names it. ``on_progress`` hears each step as it starts (``started``, labelled with the step;
    the time left) and the steps' own events. The model, optimizer and RNG are left as they were.
    ``where`` says where to measure (a ``batchfit.Where``); ``device``, ``memory_limit`` and
    ``memory_fraction`` are its shorthand for the one-line call (one that disagrees with
    ``where`` is a ConfigurationError).
    """
    check_entry(
        "advise",
        workload,
        on_progress,
        sizes=(sizes, BatchSizes),
        timing=(timing, Timing),
        checklist=(checklist, Checklist),
    )
    if baseline is not None:
        check_option("advise", "baseline", baseline, Baseline)
    run = _Checklist(target_of("advise", where, shorthand), workload, checklist, on_progress, timing)
    train, evaluation = run.find(replace(sizes, global_batch_size=None, world_size=None))
    largest = None if train is None else train.batch_size
    exploration = run.explore(sizes, largest, timing)
    leaning = largest if exploration is None else exploration.recommendation.batch_size
    batch_size = leaning if checklist.batch_size is None else checklist.batch_size
    comparison = run.compare(timing, None if train is None else train.search_seconds)
    data = run.check_data(batch_size)
    planned = run.plan(batch_size, largest, sizes, baseline)
    changes = _changes(comparison, data)
    return Advice(
        train,
        evaluation,
        exploration,
        comparison,
        data,
        planned,
        batch_size,
        rank(changes),
        costly(changes),
        noisy(changes),
        tuple(run.skipped),
        run.budget.spent(),
        tuple(run.not_measured),
        slower(changes),
    )


@dataclass
class _Checklist:
    """advise's steps on one target, each run unless skipped and told as it starts; ``skipped``
    collects why a step did not run."""

    target: ResolvedDevice
    workload: Workload
    checklist: Checklist
    on_progress: OnProgress | None
    timing: Timing
    skipped: list[str] = field(default_factory=list)
    not_measured: list[NotMeasured] = field(default_factory=list)
    budget: TimeBudget = field(init=False)

    def __post_init__(self) -> None:
        self.skipped = [f"{step}: asked" for step in self.checklist.skip]
        seconds = self.timing.time_budget_seconds
        self.budget = TimeBudget(None if seconds == 0 else seconds)  # 0: no bound

    def starting(self, step: str, cost_seconds: float = 0.0) -> bool:
        """Whether ``step`` runs: not skipped, and its expected cost fits in what is left (else
        named in ``not_measured``); told as it starts, with the time left."""
        if step in self.checklist.skip:
            return False
        if not self.budget.allows(cost_seconds):
            self.not_measured.append(NotMeasured(step, "the time budget ran out", cost_seconds))
            return False
        left = self.budget.left()
        message = "" if left == float("inf") else f"{step}: {left:.0f} s left"
        tell(self.on_progress, Event("advise", "started", step, message=message))
        return True

    def find(self, sizes: BatchSizes) -> tuple[SearchResult | None, SearchResult | None]:
        if not self.starting("find"):
            return None, None
        modes: tuple[Mode, Mode] = ("train", "eval")
        train, evaluation = (
            find_on(self.target, self.workload, mode, sizes.for_mode(mode), on_progress=self.on_progress)
            for mode in modes
        )
        return train, evaluation

    def explore(self, sizes: BatchSizes, largest: int | None, timing: Timing) -> ExploreResult | None:
        """explore in its share of what is left (as given where advise has no bound)."""
        share = min(EXPLORE_SECONDS, self.budget.left() * EXPLORE_SHARE)
        if not self.starting("explore", 0.0 if share > 0 else EXPLORE_SECONDS):
            return None
        up_to = replace(sizes, max_batch_size=largest, global_batch_size=None, world_size=None)
        goal = Goal(noise_scale=self.checklist.noise_scale)
        if self.budget.seconds is not None:
            timing = replace(timing, time_budget_seconds=share)
        return explore_on(self.target, self.workload, up_to, timing, goal, self.on_progress)

    def compare(self, timing: Timing, search_seconds: float | None) -> Comparison | None:
        """compare without explore's recommendations, its cost estimated from find's search, in
        its share of what is left."""
        cost = COMPARE_SEARCHES * (search_seconds or 0.0)
        if not self.starting("compare", cost):
            return None
        left = self.budget.left()
        budget = 0 if left == float("inf") else left * COMPARE_SHARE
        techniques = self.checklist.techniques
        return compare_on(
            self.target,
            self.workload,
            techniques,
            timing=replace(timing, time_budget_seconds=budget),
            on_progress=self.on_progress,
            recommend=False,
        )

    def check_data(self, batch_size: int | None) -> DataCheck | None:
        loader = self.checklist.loader
        if "check-data" in self.checklist.skip:
            return None
        if loader is None and self.workload.dataset is None:
            self.skipped.append("check-data: the workload has no dataset and no loader was given")
        elif batch_size is None:
            self.skipped.append("check-data: no batch size to check (find and explore skipped, none given)")
        elif self.starting("check-data", CHECK_DATA_SECONDS):
            device = self.target.device.torch_device
            left = self.budget.left()  # check-data keeps to what advise has left, at most its own default
            seconds = min(CHECK_DATA_TIMING.time_budget_seconds or left, left)
            return check_data(
                self.workload,
                batch_size,
                device=device,
                loader=loader,
                timing=replace(CHECK_DATA_TIMING, time_budget_seconds=seconds),
                on_progress=self.on_progress,
            )
        return None

    def plan(
        self, batch_size: int | None, largest: int | None, sizes: BatchSizes, baseline: Baseline | None
    ) -> Plan | None:
        if "plan" in self.checklist.skip:
            return None
        if baseline is None:
            self.skipped.append("plan: base_learning_rate and base_batch_size were not given")
            return None
        if batch_size is None and sizes.global_batch_size is None:
            self.skipped.append("plan: no batch size to plan (find and explore skipped, none given)")
            return None
        if not self.starting("plan"):
            return None
        world_size = sizes.world_size or 1
        global_batch_size = sizes.global_batch_size or (batch_size or 1) * world_size
        scaling = Scaling(optimizer=self.workload.optimizer_name())  # Adam's rule is not SGD's
        bound = largest or batch_size  # find skipped: the batch given is taken to fit
        training = TrainingFacts(noise_scale=self.checklist.noise_scale)
        return plan(
            global_batch_size,
            baseline,
            max_micro_batch_size=bound,
            world_size=world_size,
            scaling=scaling,
            training=training,
        )


def _changes(comparison: Comparison | None, data: DataCheck | None) -> list[Change]:
    """Every change a step measured against the workload as given, before ranking."""
    changes = []
    for row in comparison.rows[1:] if comparison is not None else ():
        if row.applied and row.batch_size is not None:
            changes.append(
                Change(
                    f"{row.technique} ({row.note})",
                    row.throughput_ratio,
                    row.batch_ratio,
                    f"batchfit compare --techniques {row.technique}",
                    row.at_max_batch_size,
                    row.throughput_ratio_low,
                    row.throughput_ratio_high,
                )
            )
        elif row.slow:  # one step, clearly slower: a slow-down, not noise, and no batch measured
            evidence = f"batchfit compare --techniques {row.technique} --time-slow"
            changes.append(
                Change(
                    f"{row.technique} ({row.note})", row.throughput_ratio, None, evidence, clearly_slower=True
                )
            )
    if data is not None and data.recommendation is not None:
        changes.append(
            Change(
                f"load data with {data.recommendation.setting.describe()}",
                data.recommendation.gain,
                None,
                f"batchfit check-data --batch-size {data.batch_size}",
            )
        )
    return changes

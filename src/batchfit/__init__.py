"""batchfit: which batch size should I train (and evaluate) with on this hardware?

What a user imports, all from here: the verbs (``find_batch_size``, ``explore``, ``compare``,
``check_data``, ``advise``, ``analyze``, ``plan``, ``noise_scale``, ``predict``, ``apply_autobatch``,
``MicroBatchStep``), the options they share (``BatchSizes``, ``Trials``, ``Timing``, ``Goal``,
``Where``, ``Sampling``), the noise scale's readers for a training loop (``AccumulationNoise``,
``DataParallelNoise``), the progress ``Event``, ``Workload`` and ``load_workload``, the results,
and the errors."""

from batchfit.advice_result import Advice
from batchfit.advise import STEPS as ADVISE_STEPS
from batchfit.advise import Checklist, advise
from batchfit.analyze import Analysis, AnalysisRow, analyze
from batchfit.autobatch import analyze_config, apply_autobatch
from batchfit.check_data import DataCheck, check_data
from batchfit.compare import compare
from batchfit.comparison import Comparison, ComparisonRow
from batchfit.config import ExperimentConfig, load_config
from batchfit.errors import (
    BatchfitError,
    ConfigurationError,
    DeviceUnavailableError,
    DoesNotFitError,
    HostOutOfMemoryError,
    NonFiniteError,
    OptimizerStepOutOfMemoryError,
    RankFailedError,
)
from batchfit.explore import ExploreResult, explore
from batchfit.find import find_batch_size
from batchfit.fit_check import FitCheck, check
from batchfit.micro_batch_step import MicroBatchStep
from batchfit.noise_scale import noise_scale
from batchfit.noise_scale_result import NoiseScaleResult
from batchfit.options import BatchSizes, Goal, Sampling, Timing, Trials, Where
from batchfit.policy.batch_schedule import BatchSchedule, ScheduleChange
from batchfit.policy.choose import Recommendation
from batchfit.policy.goodput_result import Goodput
from batchfit.policy.loader_settings import LoaderRecommendation, LoaderSearch, LoaderSetting, SettingRow
from batchfit.policy.micro_batch import MicroBatchChange
from batchfit.policy.noise_monitor import NoiseScaleMonitor, NoiseScaleReport
from batchfit.policy.noise_scale import GradientReading, NoiseScale
from batchfit.policy.plan import Plan, plan
from batchfit.policy.plan_options import Baseline, Scaling, TrainingFacts
from batchfit.policy.settling import Unsettled
from batchfit.policy.techniques import TECHNIQUES
from batchfit.policy.trial import MemoryModel, Mode, Trial
from batchfit.predict import predict
from batchfit.prediction import Prediction, PredictionRow, Targets
from batchfit.progress import Event, OnProgress
from batchfit.result import Result
from batchfit.runtime.devices.oom import is_out_of_memory
from batchfit.runtime.devices.resolve import memory_limit
from batchfit.runtime.distributed.gradient_noise import DataParallelNoise
from batchfit.runtime.steps.gradient_noise import AccumulationNoise
from batchfit.runtime.workloads.examples import EXAMPLES as _BUILDERS
from batchfit.runtime.workloads.specs import load_workload
from batchfit.runtime.workloads.workload import Workload
from batchfit.search_result import SearchResult

__version__ = "0.1.0"

#: The built-in examples' names (``load_workload("example:NAME")``, ``--example NAME``).
EXAMPLES: tuple[str, ...] = tuple(sorted(_BUILDERS))

__all__ = [
    "ADVISE_STEPS",
    "EXAMPLES",
    "TECHNIQUES",
    "AccumulationNoise",
    "Advice",
    "Analysis",
    "AnalysisRow",
    "Baseline",
    "BatchSchedule",
    "BatchSizes",
    "BatchfitError",
    "Checklist",
    "Comparison",
    "ComparisonRow",
    "ConfigurationError",
    "DataCheck",
    "DataParallelNoise",
    "DeviceUnavailableError",
    "DoesNotFitError",
    "Event",
    "ExperimentConfig",
    "ExploreResult",
    "FitCheck",
    "Goal",
    "Goodput",
    "GradientReading",
    "HostOutOfMemoryError",
    "LoaderRecommendation",
    "LoaderSearch",
    "LoaderSetting",
    "MemoryModel",
    "MicroBatchChange",
    "MicroBatchStep",
    "Mode",
    "NoiseScale",
    "NoiseScaleMonitor",
    "NoiseScaleReport",
    "NoiseScaleResult",
    "NonFiniteError",
    "OnProgress",
    "OptimizerStepOutOfMemoryError",
    "Plan",
    "Prediction",
    "PredictionRow",
    "RankFailedError",
    "Recommendation",
    "Result",
    "Sampling",
    "Scaling",
    "ScheduleChange",
    "SearchResult",
    "SettingRow",
    "Targets",
    "Timing",
    "TrainingFacts",
    "Trial",
    "Trials",
    "Unsettled",
    "Where",
    "Workload",
    "__version__",
    "advise",
    "analyze",
    "analyze_config",
    "apply_autobatch",
    "check",
    "check_data",
    "compare",
    "explore",
    "find_batch_size",
    "is_out_of_memory",
    "load_config",
    "load_workload",
    "memory_limit",
    "noise_scale",
    "plan",
    "predict",
]

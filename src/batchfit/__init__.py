"""batchfit: which batch size should I train (and evaluate) with on this hardware?"""

from batchfit.advise import Advice, advise
from batchfit.analyze import Analysis, AnalysisRow, analyze
from batchfit.autobatch import apply_autobatch
from batchfit.check_data import DataCheck, check_data
from batchfit.compare import Comparison, ComparisonRow, compare
from batchfit.config import ExperimentConfig, load_config
from batchfit.errors import (
    BatchfitError,
    ConfigurationError,
    DeviceUnavailableError,
    DoesNotFitError,
    OptimizerStepOutOfMemoryError,
    RankFailedError,
)
from batchfit.explore import ExploreResult, explore
from batchfit.find import SearchResult, find_batch_size
from batchfit.micro_batch_step import MicroBatchStep
from batchfit.policy.loader_settings import LoaderRecommendation, LoaderSetting, SettingRow
from batchfit.policy.micro_batch import MicroBatchChange
from batchfit.policy.plan import Plan, plan
from batchfit.policy.plan_options import Baseline, Scaling, TrainingFacts
from batchfit.policy.trial import MemoryModel, Trial
from batchfit.runtime.devices.oom import is_out_of_memory
from batchfit.runtime.devices.resolve import memory_limit
from batchfit.runtime.workloads.workload import Workload

__version__ = "0.1.0"

__all__ = [
    "Advice",
    "Analysis",
    "AnalysisRow",
    "Baseline",
    "BatchfitError",
    "Comparison",
    "ComparisonRow",
    "ConfigurationError",
    "DataCheck",
    "DeviceUnavailableError",
    "DoesNotFitError",
    "ExperimentConfig",
    "ExploreResult",
    "LoaderRecommendation",
    "LoaderSetting",
    "MemoryModel",
    "MicroBatchChange",
    "MicroBatchStep",
    "OptimizerStepOutOfMemoryError",
    "Plan",
    "RankFailedError",
    "Scaling",
    "SearchResult",
    "SettingRow",
    "TrainingFacts",
    "Trial",
    "Workload",
    "__version__",
    "advise",
    "analyze",
    "apply_autobatch",
    "check_data",
    "compare",
    "explore",
    "find_batch_size",
    "is_out_of_memory",
    "load_config",
    "memory_limit",
    "plan",
]

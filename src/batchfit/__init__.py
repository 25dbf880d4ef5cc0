"""batchfit: which batch size should I train (and evaluate) with on this hardware?

What a user imports, all from here (docs/api.md lists it): the verbs and ``MicroBatchStep``, the
options they take, the results they return, ``Workload`` and what loads one, the progress
``Event``, ``NoiseScale``, ``cap_memory`` and the errors a caller catches. The rest is imported
from its own module, named in docs/api.md."""

from batchfit.advice.advice_result import Advice
from batchfit.advice.advise import advise
from batchfit.analysis.analyze import Analysis, analyze
from batchfit.analysis.apply_autobatch import apply_autobatch
from batchfit.analysis.config import load_config
from batchfit.comparison.compare import compare
from batchfit.comparison.comparison import Comparison
from batchfit.data_check.check_data import DataCheck, check_data
from batchfit.errors import BatchfitError, ConfigurationError, DoesNotFitError
from batchfit.exploration.explore import explore
from batchfit.exploration.explore_result import ExploreResult
from batchfit.fit_check.check import FitCheck, check
from batchfit.noise.noise_scale import noise_scale
from batchfit.noise.noise_scale_result import NoiseScaleResult
from batchfit.options import BatchSizes, Goal, Sampling, Timing, Trials, Where
from batchfit.policy.noise.noise_scale import NoiseScale
from batchfit.policy.plan.plan import Plan, plan
from batchfit.policy.plan.plan_options import Baseline
from batchfit.prediction.predict import predict
from batchfit.prediction.prediction import Prediction, Targets
from batchfit.progress import Event
from batchfit.result import Result
from batchfit.runtime.devices.resolve import cap_memory
from batchfit.runtime.workloads.examples import EXAMPLES as _BUILDERS
from batchfit.runtime.workloads.specs import load_workload
from batchfit.runtime.workloads.workload import Workload
from batchfit.search.find_batch_size import find_batch_size
from batchfit.search.search_result import SearchResult
from batchfit.training_loop.micro_batch_step import MicroBatchOptions, MicroBatchStep

__version__ = "0.1.0"

#: The built-in examples' names (``load_workload("example:NAME")``, ``--example NAME``).
EXAMPLES: tuple[str, ...] = tuple(sorted(_BUILDERS))

# Grouped as docs/api.md lists them (tests/test_public_api.py holds the two equal).
__all__ = [  # noqa: RUF022
    # The verbs, and the training step that adapts its micro-batch.
    "find_batch_size",
    "explore",
    "compare",
    "check_data",
    "advise",
    "analyze",
    "check",
    "plan",
    "noise_scale",
    "predict",
    "apply_autobatch",
    "MicroBatchStep",
    "MicroBatchOptions",
    # The options the verbs take: shared, or a verb's required argument.
    "BatchSizes",
    "Trials",
    "Timing",
    "Goal",
    "Where",
    "Sampling",
    "Targets",
    "Baseline",
    # The results the verbs return.
    "SearchResult",
    "ExploreResult",
    "Comparison",
    "DataCheck",
    "Advice",
    "Analysis",
    "FitCheck",
    "Prediction",
    "NoiseScaleResult",
    "Plan",
    "Result",
    # What a call needs besides: the workload, progress, a noise scale, a memory cap, the config.
    "Workload",
    "load_workload",
    "load_config",
    "Event",
    "NoiseScale",
    "cap_memory",
    "EXAMPLES",
    "__version__",
    # The errors a caller catches (the rest: batchfit.errors).
    "BatchfitError",
    "ConfigurationError",
    "DoesNotFitError",
]

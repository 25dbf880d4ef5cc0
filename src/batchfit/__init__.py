"""batchfit: which batch size should I train (and evaluate) with on this hardware?"""

from batchfit.errors import (
    BatchfitError,
    ConfigurationError,
    DeviceUnavailableError,
    DoesNotFitError,
)
from batchfit.find import SearchResult, find_batch_size
from batchfit.oom import is_out_of_memory
from batchfit.search import MemoryModel, Trial
from batchfit.tracker import memory_limit
from batchfit.workload import Workload

__version__ = "0.1.0"

__all__ = [
    "BatchfitError",
    "ConfigurationError",
    "DeviceUnavailableError",
    "DoesNotFitError",
    "MemoryModel",
    "SearchResult",
    "Trial",
    "Workload",
    "__version__",
    "find_batch_size",
    "is_out_of_memory",
    "memory_limit",
]

"""modelopt: search-based compression of trained PyTorch vision models, without fine-tuning.

Example:
    >>> import modelopt
    >>> result = modelopt.optimize()          # ResNet-20 on the bundled CIFAR-10 sample
    >>> result.best.metrics.compression, result.best_test.retention
"""

from modelopt import _name_clash  # noqa: F401 -- first, for its warning when nvidia-modelopt is installed too
from modelopt._version import __version__
from modelopt.api import build_workload, evaluate, optimize
from modelopt.compressors import COMPRESSORS, Compressor, Granularity, QuantSpec
from modelopt.config import RunConfig
from modelopt.data import Dataset, load_data
from modelopt.errors import ConfigError, LoadError, ModeloptError, NameClashWarning
from modelopt.evaluator import Evaluator, Metrics
from modelopt.exporters import export, load
from modelopt.models import LoadedModel, list_models, load_model
from modelopt.objective import Objective
from modelopt.plan import Decision, Plan
from modelopt.reports import report  # the verb; the writers are modelopt.reports.*
from modelopt.run.runner import RunResult
from modelopt.search import STRATEGIES, Strategy
from modelopt.space import SearchSpace
from modelopt.trial import Trial
from modelopt.workload import Workload

__all__ = [
    "COMPRESSORS",
    "STRATEGIES",
    "Compressor",
    "ConfigError",
    "Dataset",
    "Decision",
    "Evaluator",
    "Granularity",
    "LoadError",
    "LoadedModel",
    "Metrics",
    "ModeloptError",
    "NameClashWarning",
    "Objective",
    "Plan",
    "QuantSpec",
    "RunConfig",
    "RunResult",
    "SearchSpace",
    "Strategy",
    "Trial",
    "Workload",
    "__version__",
    "build_workload",
    "evaluate",
    "export",
    "list_models",
    "load",
    "load_data",
    "load_model",
    "optimize",
    "report",
]

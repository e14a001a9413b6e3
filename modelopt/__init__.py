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
from modelopt.config.run_config import RunConfig
from modelopt.data.dataset import Dataset, load_data
from modelopt.errors import ConfigError, LoadError, ModeloptError, NameClashWarning
from modelopt.evaluation.evaluator import Evaluator, Metrics
from modelopt.evaluation.trial import Trial
from modelopt.exporters import load
from modelopt.model.loader import LoadedModel, list_models, load_model
from modelopt.model.workload import Workload
from modelopt.objective import Objective
from modelopt.plan.plan import Decision, Plan
from modelopt.plan.space import SearchSpace
from modelopt.reports import report  # the verb; the writers are modelopt.reports.*
from modelopt.run.export import export
from modelopt.run.runner import RunResult
from modelopt.search import STRATEGIES, Strategy

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

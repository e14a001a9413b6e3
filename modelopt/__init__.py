"""modelopt: search-based compression of trained PyTorch vision models, without fine-tuning.

Example:
    >>> import modelopt
    >>> result = modelopt.optimize()          # ResNet-20 on the bundled CIFAR-10 sample
    >>> result.best.metrics.compression, result.best_test.retention
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from modelopt import _name_clash  # noqa: F401 -- first, for its warning when nvidia-modelopt is installed too
from modelopt._version import __version__

if TYPE_CHECKING:
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
    from modelopt.reports import report
    from modelopt.run.export import export
    from modelopt.run.runner import RunResult
    from modelopt.search import STRATEGIES, Strategy

# The public names, each imported from its module on first use (PEP 562): `import modelopt` and the command line's
# entry stay free of torch until a name is used, so Ctrl-C while the CLI starts is one line, not an import's
# traceback (`modelopt.cli.entry`).
_WHERE = {
    "build_workload": "modelopt.api",
    "evaluate": "modelopt.api",
    "optimize": "modelopt.api",
    "COMPRESSORS": "modelopt.compressors",
    "Compressor": "modelopt.compressors",
    "Granularity": "modelopt.compressors",
    "QuantSpec": "modelopt.compressors",
    "RunConfig": "modelopt.config.run_config",
    "Dataset": "modelopt.data.dataset",
    "load_data": "modelopt.data.dataset",
    "ConfigError": "modelopt.errors",
    "LoadError": "modelopt.errors",
    "ModeloptError": "modelopt.errors",
    "NameClashWarning": "modelopt.errors",
    "Evaluator": "modelopt.evaluation.evaluator",
    "Metrics": "modelopt.evaluation.evaluator",
    "Trial": "modelopt.evaluation.trial",
    "load": "modelopt.exporters",
    "LoadedModel": "modelopt.model.loader",
    "list_models": "modelopt.model.loader",
    "load_model": "modelopt.model.loader",
    "Workload": "modelopt.model.workload",
    "Objective": "modelopt.objective",
    "Decision": "modelopt.plan.plan",
    "Plan": "modelopt.plan.plan",
    "SearchSpace": "modelopt.plan.space",
    "report": "modelopt.reports",
    "export": "modelopt.run.export",
    "RunResult": "modelopt.run.runner",
    "STRATEGIES": "modelopt.search",
    "Strategy": "modelopt.search",
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'modelopt' has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_WHERE})


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

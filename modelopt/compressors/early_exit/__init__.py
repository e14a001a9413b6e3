"""Early exit: heads fitted on a frozen backbone, per-exit thresholds, and a network that stops early.

- `backbone.py`: cut a model into stem, blocks (the candidate exit points) and tail; MACs per point.
- `heads.py`: pooled-feature heads (linear or one hidden layer), saved as plain tensors.
- `features.py`: one backbone pass keeping every exit point's pooled features (cached).
- `fit.py`: L-BFGS fitting to labels or, label-free, to the full model's predictions; temperature.
- `simulate.py`: the one-pass evaluator (each sample's exit, accuracy, retention, agreement, MACs).
- `thresholds.py`: per-exit thresholds on val under a retention floor.
- `module.py`: `EarlyExitNet`, the deployable module that returns at the first confident exit.

Example:
    >>> bb = split_backbone(model)
    >>> heads = fit_exit_heads(extract_features(bb, x_fit), [p.name for p in bb.points])
    >>> policy = choose_thresholds(exit_table(heads, extract_features(bb, x_val, labels=y_val), bb))
    >>> net = EarlyExitNet(bb, heads, policy).eval()
"""

from modelopt.compressors.early_exit.backbone import Backbone, ExitPoint, exit_layers, split_backbone
from modelopt.compressors.early_exit.features import (
    Features,
    cached_features,
    extract_features,
    normalise,
    read_images,
)
from modelopt.compressors.early_exit.fit import (
    FitConfig,
    FitTarget,
    fit_exit_heads,
    fit_head,
    fit_temperature,
    soft_targets,
)
from modelopt.compressors.early_exit.heads import ExitHead, HeadSpec, pool_features
from modelopt.compressors.early_exit.module import EarlyExitNet, heads_state, load_early_exit
from modelopt.compressors.early_exit.simulate import (
    ExitMetrics,
    ExitPolicy,
    ExitTable,
    assign_exits,
    exit_table,
    first_confident,
    simulate,
)
from modelopt.compressors.early_exit.thresholds import (
    ChooserConfig,
    choose_thresholds,
    threshold_path,
)

__all__ = [
    "Backbone",
    "ChooserConfig",
    "EarlyExitNet",
    "ExitHead",
    "ExitMetrics",
    "ExitPoint",
    "ExitPolicy",
    "ExitTable",
    "Features",
    "FitConfig",
    "FitTarget",
    "HeadSpec",
    "assign_exits",
    "cached_features",
    "choose_thresholds",
    "exit_layers",
    "exit_table",
    "extract_features",
    "first_confident",
    "fit_exit_heads",
    "fit_head",
    "fit_temperature",
    "heads_state",
    "load_early_exit",
    "normalise",
    "pool_features",
    "read_images",
    "simulate",
    "soft_targets",
    "split_backbone",
    "threshold_path",
]

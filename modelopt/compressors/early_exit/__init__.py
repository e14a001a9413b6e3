"""Early exit: heads fitted on a frozen backbone, per-exit thresholds, and a network that stops early.

- `compressor.py`: the `early_exit` plugin (`EarlyExit`): its choices, plan forms and size accounting.
- `routing.py`: the plugin inside the evaluator: a plan's exits, their heads, priors, packing.
- `runtime.py`: where the candidate exits sit, fitting their heads, reading them during a plan's pass.
- `policy.py`: a plan's exits and thresholds, and the rule that decides where each sample leaves.
- the cut into stem, blocks (the candidate exit points) and tail: `modelopt.model.backbone` (shared with
  reconstruction).
- `heads.py`: pooled-feature heads (linear or one hidden layer), saved as plain tensors.
- `features.py`: one backbone pass keeping every exit point's pooled features.
- `fit.py`: label-free L-BFGS fitting to the full model's predictions; temperature.
- `module.py`: `EarlyExitNet`, the deployable module that returns at the first confident exit.
- `pools.py`: the extra unlabeled images heads may be fitted on (`exit_data`).

The standalone study (a one-pass simulator, the per-exit threshold chooser) is benchmarks/early_exit.py's.

Example:
    >>> space = SearchSpace(wl.layers, build_compressors(["quantize", "early_exit"], model=wl.model))
"""

from modelopt.compressors.early_exit.compressor import EarlyExit, ExitChoice

__all__ = ["EarlyExit", "ExitChoice"]

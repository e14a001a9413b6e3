"""The bytes a plan's stored values take in the packed file, coded (`form_bytes`), measured on its own codes.

The weight's compression measures them on the way (`LayerWeights._compress`, GPTQ once per layer and choice), into
the workload's `coded_cache` beside its tensors; a refitted record's layers are measured on the refit's codes,
cached under (layer key, refit digest).
"""

from __future__ import annotations

from modelopt.compressors.contract import form_bytes
from modelopt.evaluation.fitted import Fitted
from modelopt.evaluation.layer_weights import LayerWeights
from modelopt.plan.plan import Plan

__all__ = ["coded_bytes"]


def coded_bytes(layers: LayerWeights, plan: Plan, fitted: Fitted | None = None) -> dict[str, int]:
    """Per layer whose stored values are coded (integer codes, sparse masks), the bytes the packed file's segments
    take for them; layers stored as dense float32 are absent.

    Example:
        >>> coded_bytes(ev.states.layers, plan)["layer1.0.conv1"]
    """
    cache = layers.workload.coded_cache
    keys = layers.layer_keys(plan)
    if any(key not in cache for key in keys.values()):
        layers.weights(plan)  # compressing the weights measures them
    out = {}
    for name, key in keys.items():
        at = (key, fitted.digest) if fitted is not None and name in fitted.weights else key
        if at not in cache:  # a refit's codes, or a weight compressed before it was measured
            cache[at] = form_bytes(layers.steps(plan, name, fitted if at is not key else None)[-1].form)
        if (n := cache[at]) is not None:
            out[name] = n
    return out

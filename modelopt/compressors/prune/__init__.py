"""Pruning: unstructured sparsity per layer (any weights, or 2:4), or structured removal of a channel group.

- `compressor.py`: the `prune` plugin (`Prune`): its menu, masks and kept filters, and size accounting.
- `options.py`: its options record (`PruneOptions`), one default each, which checks its own fields; the kinds
  and criteria it names (`PruneKind`, `Criterion`).
- `sparsegpt.py`: unstructured masks with error feedback (SparseGPT / OBS) on the layer's calibration inputs.

Example:
    >>> p = Prune(sparsity=(0.5,), kind=("structured",))
    >>> n_kept(64, 0.25)
    48
"""

from modelopt.compressors.prune.compressor import (
    Prune,
    PruneSpec,
    channel_order,
    kept_filters,
    magnitude_mask,
    n_kept,
    pattern_mask,
)
from modelopt.compressors.prune.options import Criterion, PruneKind, PruneOptions

__all__ = ["Criterion", "Prune", "PruneKind", "PruneOptions", "PruneSpec", "channel_order", "kept_filters",
           "magnitude_mask", "n_kept", "pattern_mask"]

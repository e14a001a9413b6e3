"""Calibrated rounding (GPTQ / OBQ): how the `quantize` plugin picks codes once scales are fixed.

`Rounding.GPTQ` picks them with the layer's calibration inputs by GPTQ's column sweep (Frantar et al., 2023), the
solver in `modelopt.solvers.gptq` (shared with SparseGPT and reconstruction, which runs it on a plan's own inputs);
its derivation is there.
"""

from __future__ import annotations

from enum import Enum

from modelopt.solvers.gptq import BLOCK, gptq_round, inverse_factor, layer_factor

__all__ = ["BLOCK", "Rounding", "gptq_round", "inverse_factor", "layer_factor"]


class Rounding(str, Enum):
    """How codes are picked once scales are fixed: each weight alone (nearest), or with the
    layer's calibration inputs (gptq: second-order error feedback, this module)."""

    NEAREST = "nearest"
    GPTQ = "gptq"

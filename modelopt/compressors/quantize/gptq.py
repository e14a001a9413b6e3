"""Calibrated rounding (GPTQ / OBQ): how the `quantize` plugin picks codes once scales are fixed.

`Rounding.GPTQ` picks them with the layer's calibration inputs by GPTQ's column sweep (Frantar et al., 2023), the
solver in `modelopt.model.gptq_sweep` (shared with reconstruction, which runs it on a plan's own inputs); its
derivation is there.
"""

from __future__ import annotations

from enum import Enum

from modelopt.model.gptq_sweep import BLOCK, DAMPING, gptq_round, inverse_factor, layer_factor

__all__ = ["BLOCK", "DAMPING", "Rounding", "gptq_round", "inverse_factor", "layer_factor"]


class Rounding(str, Enum):
    """How codes are picked once scales are fixed: each weight alone (nearest), or with the
    layer's calibration inputs (gptq: second-order error feedback, this module)."""

    NEAREST = "nearest"
    GPTQ = "gptq"

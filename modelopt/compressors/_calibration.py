"""What calibration data a compressor's choice needs, declared in one record the evaluator reads.

A compressor says, per choice, which of three measurements on the float model's calib images it needs
(`Compressor.calibration`); the evaluator makes each once per run, shares it between plans and charges it to
the first plan that needs it (`modelopt.evaluation.compressed_state`):

- `layer_inputs`: the second moments of the layer's inputs (GPTQ's rounding, SparseGPT's masks, the refit of
  the layers that read removed channels), handed to `Compressor.apply_calibrated` and `Compressor.pack`;
- `norm_images`: images batch-norm statistics are re-estimated on once the plan's weights are in place;
- `input_ranges`: how the ranges of the layer's quantized inputs are measured (read where the choice
  quantizes them, `Precision.activation` < 32).
"""

from __future__ import annotations

from dataclasses import dataclass

from modelopt.compressors._inputs import Calibration

__all__ = ["CalibrationNeed"]


@dataclass(frozen=True)
class CalibrationNeed:
    """One choice's calibration data; the default needs none.

    Example:
        >>> CalibrationNeed(layer_inputs=256, norm_images=64)  # GPTQ at 4 bits or fewer
    """

    layer_inputs: int = 0  # calib images whose layer-input second moments the choice uses (0: none)
    norm_images: int = 0  # calib images batch norms are re-estimated on with the choice in place (0: none)
    input_ranges: Calibration | None = None  # how quantized inputs' ranges are measured; None: `Calibration()`

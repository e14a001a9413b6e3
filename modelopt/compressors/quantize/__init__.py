"""Weight quantization: symmetric INT2..INT8 per tensor, per channel or per group, rounded to nearest or by GPTQ, and
optionally 8-bit input activations (W8A8); or rate grids, sized for the entropy coder (`RateSpec`).

- `compressor.py`: the `quantize` plugin (`Quantize`): its menu, the scale search, quantize-dequantize and size
  accounting.
- `options.py`: its options record (`QuantizeOptions`), one default each and the check of each field.
- `spec.py`: a layer's choice (`QuantSpec`, `ActQuantSpec` with quantized inputs, `RateSpec` a rate grid).
- `rate.py`: rate grids' steps, set for the codes' entropy rather than their width, and their codes.
- `gptq.py`: how codes are picked once scales are fixed (`Rounding`); the GPTQ solver is `modelopt.solvers.gptq`.

Example:
    >>> q = Quantize(bits=(8, 4), rounding=("nearest",))
    >>> q.menu(layer)[1]
    QuantSpec(bits=8, ...)
"""

from modelopt.compressors.quantize.compressor import (
    ActQuantSpec,
    Granularity,
    Quantize,
    QuantizeOptions,
    QuantSpec,
    RateSpec,
    Rounding,
    dequantize,
    parse_rounding,
    quantize,
    search_scales,
)

__all__ = ["ActQuantSpec", "Granularity", "QuantSpec", "Quantize", "QuantizeOptions", "RateSpec", "Rounding",
           "dequantize", "parse_rounding", "quantize", "search_scales"]

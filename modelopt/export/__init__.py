"""Export of a plan: the packed checkpoint (`modelopt.load` reloads it) and ONNX (QDQ) for ONNX Runtime.

`modelopt.export` (the function) shadows this package's name on the top-level module; import
the writers from their modules: ``from modelopt.export.onnx import export_onnx``.
"""

from modelopt.export._export import FORMATS, export
from modelopt.export.bitsandbytes import (  # bitsandbytes itself is imported only when a conversion runs
    BitsandbytesAgreement,
    LinearConversion,
    bitsandbytes_agreement,
    to_bitsandbytes,
)
from modelopt.export.packed import export_packed, load

__all__ = [
    "FORMATS",
    "BitsandbytesAgreement",
    "LinearConversion",
    "bitsandbytes_agreement",
    "export",
    "export_packed",
    "load",
    "to_bitsandbytes",
]

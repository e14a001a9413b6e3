"""Export of a plan: the packed checkpoint (`modelopt.load` reloads it) and ONNX (QDQ) for ONNX Runtime.

The verb is `modelopt.export(...)` (a function); this package, `modelopt.exporters`, holds the
writers, one module each: ``from modelopt.exporters.onnx import export_onnx``.
"""

from modelopt.exporters._export import FORMATS, export
from modelopt.exporters.bitsandbytes import (  # bitsandbytes itself is imported only when a conversion runs
    BitsandbytesAgreement,
    LinearConversion,
    bitsandbytes_agreement,
    to_bitsandbytes,
)
from modelopt.exporters.packed import export_packed, load

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

"""The writers of a plan applied to a model: the packed checkpoint (`modelopt.load` reloads it), ONNX (QDQ)
for ONNX Runtime, and bitsandbytes Linear layers; one module each (``from modelopt.exporters.onnx import
export_onnx``). Each takes the evaluator that scored the plan; the verb `modelopt.export`, which also
starts from a run folder, is `modelopt.run.export`.
"""

from modelopt.exporters.bitsandbytes import (  # bitsandbytes itself is imported only when a conversion runs
    BitsandbytesAgreement,
    LinearConversion,
    bitsandbytes_agreement,
    to_bitsandbytes,
)
from modelopt.exporters.packed import export_packed
from modelopt.exporters.packed_load import load

__all__ = [
    "BitsandbytesAgreement",
    "LinearConversion",
    "bitsandbytes_agreement",
    "export_packed",
    "load",
    "to_bitsandbytes",
]

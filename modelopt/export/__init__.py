"""Export of a plan: the packed checkpoint (`modelopt.load` reloads it) and ONNX (QDQ) for ONNX Runtime.

`modelopt.export` (the function) shadows this package's name on the top-level module; import
the writers from their modules: ``from modelopt.export.onnx import export_onnx``.
"""

from modelopt.export._export import FORMATS, export
from modelopt.export.packed import export_packed, load

__all__ = ["FORMATS", "export", "export_packed", "load"]

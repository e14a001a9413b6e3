"""The compressors' public contract: what a plugin subclasses and returns, and what the rest of modelopt reads of a
plan's compressed layers. Code outside `modelopt.compressors` imports these names from here (or from the package),
never from the underscore modules that hold them, which may move.

- the plugin base and its choices: `Compressor`, `Choice`, `Precision`, the registry `COMPRESSORS`;
- the options record and its settings: `Options`, `option`, `Setting`, `SettingKind`, `enum_member`;
- the report columns a plugin adds: `Cell`, `ReportColumn`;
- capabilities: `Routes` and `Routing` (samples leave early: `Route`, `ExitTap`, `Forward`), `RemovesChannels`,
  `RemovesBranch`, `CalibrationNeed`, and `UsesAnalyses`;
- structural analyses a compressor reads (`UsesAnalyses.analyses`): `Analysis`, what it reads of the model
  (`ModelView`), their registry `ANALYSES`, and the shipped ones, `ChannelAnalysis` (a root's `ChannelGroup`) and
  `BranchAnalysis`;
- stored forms of compressed weights: `Storage`, `WeightForm`, `IntegerWeight`, `Granularity`, the packing helpers
  and the entropy-coded segments the packed file stores (`encode_codes`, `form_bytes`, ...);
- quantized layer inputs (W8A8): `Calibration`, `InputQParams` and the functions that measure and apply them.

Example:
    >>> from modelopt.compressors.contract import COMPRESSORS, Compressor, Options, option
"""

from modelopt.compressors._analyses import UsesAnalyses
from modelopt.compressors._base import Choice, Compressor, Precision
from modelopt.compressors._branches import RemovesBranch
from modelopt.compressors._calibration import CalibrationNeed
from modelopt.compressors._channels import RemovesChannels
from modelopt.compressors._entropy import (
    decode_codes,
    decode_mask_segment,
    encode_codes,
    encode_mask_segment,
    form_bytes,
    kept_codes,
)
from modelopt.compressors._inputs import (
    QPARAM_BYTES,
    Calibration,
    InputQParams,
    activation_bits,
    calibration_method,
    fake_quantize,
    fake_quantized_inputs,
    input_ranges,
    install_input_quantizers,
)
from modelopt.compressors._options import Options, option
from modelopt.compressors._packing import (
    SCALE_DTYPE,
    Granularity,
    IntegerWeight,
    Storage,
    WeightForm,
    code_range,
    decode_mask,
    encode_mask,
    pack_codes,
    scale_units,
    sparse_encoding,
    sparse_index_bytes,
    to_scale_dtype,
    unpack_codes,
)
from modelopt.compressors._registry import COMPRESSORS
from modelopt.compressors._routing import ExitTap, Forward, Route, Routes, Routing
from modelopt.compressors._surface import Cell, ReportColumn, Setting, SettingKind, enum_member
from modelopt.model.analysis import ANALYSES, Analysis, ModelView
from modelopt.model.branches import BranchAnalysis
from modelopt.model.channels import ChannelAnalysis, ChannelGroup

__all__ = [
    "ANALYSES",
    "COMPRESSORS",
    "QPARAM_BYTES",
    "SCALE_DTYPE",
    "Analysis",
    "BranchAnalysis",
    "Calibration",
    "CalibrationNeed",
    "Cell",
    "ChannelAnalysis",
    "ChannelGroup",
    "Choice",
    "Compressor",
    "ExitTap",
    "Forward",
    "Granularity",
    "InputQParams",
    "IntegerWeight",
    "ModelView",
    "Options",
    "Precision",
    "RemovesBranch",
    "RemovesChannels",
    "ReportColumn",
    "Route",
    "Routes",
    "Routing",
    "Setting",
    "SettingKind",
    "Storage",
    "UsesAnalyses",
    "WeightForm",
    "activation_bits",
    "calibration_method",
    "code_range",
    "decode_codes",
    "decode_mask",
    "decode_mask_segment",
    "encode_codes",
    "encode_mask",
    "encode_mask_segment",
    "enum_member",
    "fake_quantize",
    "fake_quantized_inputs",
    "form_bytes",
    "input_ranges",
    "install_input_quantizers",
    "kept_codes",
    "option",
    "pack_codes",
    "scale_units",
    "sparse_encoding",
    "sparse_index_bytes",
    "to_scale_dtype",
    "unpack_codes",
]

"""The compressors' public contract: what a plugin subclasses and returns, and what the rest of modelopt reads of a
plan's compressed layers. Code outside `modelopt.compressors` imports these names from here (or from the package),
never from the underscore modules that hold them, which may move.

- the plugin base and its choices: `Compressor`, `Choice`, `Precision`, the registry `COMPRESSORS`;
- the options record and its settings: `Options`, `option`, `Setting`, `SettingKind`, `enum_member`;
- the report columns a plugin adds: `Cell`, `ReportColumn`;
- capabilities: `Routes` and `Routing` (samples leave early: `Route`, `ExitTap`, `Forward`), `RemovesChannels`,
  `RemovesBranch`, `CalibrationNeed`;
- stored forms of compressed weights: `Storage`, `WeightForm`, `IntegerWeight`, `Granularity` and the packing helpers;
- quantized layer inputs (W8A8): `Calibration`, `InputQParams` and the functions that measure and apply them.

Example:
    >>> from modelopt.compressors.contract import COMPRESSORS, Compressor, Options, option
"""

from modelopt.compressors._base import Choice, Compressor, Precision
from modelopt.compressors._branches import RemovesBranch
from modelopt.compressors._calibration import CalibrationNeed
from modelopt.compressors._channels import RemovesChannels
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

__all__ = ["COMPRESSORS", "QPARAM_BYTES", "SCALE_DTYPE", "Calibration", "CalibrationNeed", "Cell", "Choice",
           "Compressor", "ExitTap", "Forward", "Granularity", "InputQParams", "IntegerWeight", "Options", "Precision",
           "RemovesBranch", "RemovesChannels", "ReportColumn", "Route", "Routes", "Routing", "Setting", "SettingKind",
           "Storage", "WeightForm", "activation_bits", "calibration_method", "code_range", "decode_mask",
           "encode_mask", "enum_member", "fake_quantize", "fake_quantized_inputs", "input_ranges",
           "install_input_quantizers", "option", "pack_codes", "scale_units", "sparse_encoding", "sparse_index_bytes",
           "to_scale_dtype", "unpack_codes"]

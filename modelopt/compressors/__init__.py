"""Compressor plugins: each offers per-layer choices and applies them.

Outside this package (tests and docs too), code reaches compressors through the registry and the public contract,
`modelopt.compressors.contract`, never through the underscore modules that hold the contract (`_base`, its
capabilities `_routing`, `_channels`, `_branches` and `_analyses`, `_packing`, `_calibration`, `_surface`, `_inputs`,
`_options`; they may move) nor a plugin's own module. Each plugin of more than one idea is a folder: `quantize/`,
`prune/`, `early_exit/`.
"""

from modelopt.compressors._base import Choice, Compressor
from modelopt.compressors._options import Options, option
from modelopt.compressors._packing import Storage
from modelopt.compressors._registry import COMPRESSORS
from modelopt.compressors._surface import Cell, ReportColumn, Setting, SettingKind
from modelopt.compressors.depth import Depth
from modelopt.compressors.early_exit.compressor import EarlyExit, ExitChoice
from modelopt.compressors.prune import Prune, PruneKind, PruneSpec
from modelopt.compressors.quantize import Granularity, Quantize, QuantSpec, Rounding
from modelopt.errors import ConfigError

# The compressor a run record that names none ran (the first versions of modelopt had no other).
FIRST_COMPRESSOR = Quantize.name

__all__ = ["COMPRESSORS", "FIRST_COMPRESSOR", "Cell", "Choice", "Compressor", "Depth", "EarlyExit", "ExitChoice",
           "Granularity", "Options", "Prune", "PruneKind", "PruneSpec", "QuantSpec", "Quantize", "ReportColumn",
           "Rounding", "Setting", "SettingKind", "Storage", "compressor_settings", "option"]


def compressor_settings() -> dict[str, tuple[str, Setting]]:
    """Every registered compressor's settings by option name: {option: (compressor, Setting)} (each declared by a
    field of its options record, `Compressor.record`).

    Raises:
        ConfigError: two compressors declare the same option (a plugin must choose another name).
    """
    out: dict[str, tuple[str, Setting]] = {}
    for name in COMPRESSORS.names():
        for setting in COMPRESSORS.get(name).record.settings():
            if setting.option in out:
                raise ConfigError(f"compressors {out[setting.option][0]!r} and {name!r} both declare the setting "
                                  f"{setting.option!r}; one of them must rename it")
            out[setting.option] = (name, setting)
    return out

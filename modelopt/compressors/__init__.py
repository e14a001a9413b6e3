"""Compressor plugins: each offers per-layer choices and applies them."""

from modelopt.compressors._base import Choice, Compressor, Storage
from modelopt.compressors._registry import COMPRESSORS
from modelopt.compressors.early_exit.compressor import EarlyExit, ExitChoice
from modelopt.compressors.prune import Prune, PruneKind, PruneSpec
from modelopt.compressors.quantize import Granularity, Quantize, QuantSpec, Rounding

__all__ = ["COMPRESSORS", "Choice", "Compressor", "EarlyExit", "ExitChoice", "Granularity", "Prune", "PruneKind",
           "PruneSpec", "QuantSpec", "Quantize", "Rounding", "Storage"]

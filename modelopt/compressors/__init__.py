"""Compressor plugins: each offers per-layer choices and applies them."""

from modelopt.compressors._base import Choice, Compressor
from modelopt.compressors._registry import COMPRESSORS
from modelopt.compressors.quantize import Granularity, QuantSpec, Quantize

__all__ = ["COMPRESSORS", "Choice", "Compressor", "Granularity", "QuantSpec", "Quantize"]

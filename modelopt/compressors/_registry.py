"""Registry of compressor plugins (entry-point group `modelopt.compressors`)."""

from __future__ import annotations

from modelopt._registry import Registry
from modelopt.compressors._base import Compressor

COMPRESSORS: Registry[type[Compressor]] = Registry("compressor", "modelopt.compressors")

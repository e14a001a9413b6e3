"""Registry of compressor plugins (entry-point group `modelopt.compressors`).

A compressor's name is the one it is registered under, written once (timm's `register_model` takes it from the
function): ``@COMPRESSORS.register("round1")`` sets ``Round.name``.
"""

from __future__ import annotations

from modelopt._registry import Registry, named
from modelopt.compressors._base import Compressor

_named = named("compressor")

COMPRESSORS: Registry[type[Compressor]] = Registry("compressor", "modelopt.compressors", _named)

"""Registry of compressor plugins (entry-point group `modelopt.compressors`).

A compressor's name is the one it is registered under, written once (timm's `register_model` takes it from the
function): ``@COMPRESSORS.register("round1")`` sets ``Round.name``.
"""

from __future__ import annotations

from modelopt._registry import Registry
from modelopt.compressors._base import Compressor


def _named(name: str, cls: type[Compressor]) -> None:
    own = vars(cls).get("name")
    if own is not None and own != name:
        raise ValueError(f"compressor class {cls.__name__} says name = {own!r} but is registered as {name!r}; "
                         "drop its name: registering names it")
    cls.name = name


COMPRESSORS: Registry[type[Compressor]] = Registry("compressor", "modelopt.compressors", _named)

"""A run's compressors from names and options, with the tool's defaults for them (declared by each
compressor: `Compressor.settings`). `modelopt.config.build` builds runs from these."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from torch import nn

from modelopt.compressors import COMPRESSORS, FIRST_COMPRESSOR, Compressor
from modelopt.compressors._routing import Routes
from modelopt.errors import ConfigError

# Full val evaluations a run may spend when the user does not say: 100 keeps the default run (2,000 JPEG val
# images, 7,154 to confirm) under three minutes on 2 CPU cores; more budget can still pay (--budget).
DEFAULT_BUDGET = 100.0


def default_options(objective: str = "size") -> dict[str, dict[str, Any]]:
    """The tool's compressor options under `objective`, where the user gives none: each registered
    compressor's declared setting defaults (the classes' own defaults are the older behaviour, so run
    records written before a default changed rebuild as they ran).

    Example:
        >>> default_options()["quantize"]["bits"]
        [8, 4, 3]
    """
    out: dict[str, dict[str, Any]] = {}
    for name in COMPRESSORS.names():
        values = {s.option: s.default_for(objective) for s in COMPRESSORS.get(name).settings}
        values = {k: v for k, v in values.items() if v is not None}
        if values:
            out[name] = values
    return out


def default_compressors(objective: str = "size", model: nn.Module | None = None) -> list[str]:
    """The registered compressors that can lower `objective` (and, given a model, can handle it).

    Example:
        >>> default_compressors("size"), default_compressors("macs")
        (['prune', 'quantize'], ['early_exit', 'prune'])
    """
    names = []
    for name in COMPRESSORS.names():
        cls = COMPRESSORS.get(name)
        if objective not in cls.reduces:
            continue
        if model is not None and issubclass(cls, Routes):
            try:
                cls.model_options(model)
            except ConfigError:
                continue  # e.g. early exit on a model it cannot cut into blocks
        names.append(name)
    return names


def build_compressors(
    names: Sequence[str] | None = None, options: Mapping[str, Mapping[str, Any]] | None = None,
    model: nn.Module | None = None,
) -> list[Compressor]:
    """Instantiates compressors by registry name with per-compressor options.

    Args:
        names: Registry names; None: the first compressor (quantization) alone.
        options: Per-compressor constructor options; None: the tool's defaults (`default_options`).
            Saved run records pass theirs: a record without `rounding` predates it and means
            nearest, the class default.
        model: The model they will compress: options a compressor derives from it
            (`Routes.model_options`, e.g. early exit's candidate exits) fill in what
            `options` leaves out.
    """
    if options is None:
        options = default_options()
    for name in options:
        COMPRESSORS.get(name)
    out = []
    for n in (FIRST_COMPRESSOR,) if names is None else names:
        cls = COMPRESSORS.get(n)
        derived = cls.model_options(model) if model is not None and issubclass(cls, Routes) else {}
        out.append(cls(**{**derived, **dict(options.get(n, {}))}))
    return out

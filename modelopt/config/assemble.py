"""A run's compressors from names and options, with the tool's defaults for them (each compressor's options
record, `Compressor.record`). `modelopt.config.build` builds runs from these."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from torch import nn

from modelopt.compressors import COMPRESSORS, FIRST_COMPRESSOR, Compressor, Options
from modelopt.compressors.contract import Routes
from modelopt.errors import ConfigError

# Full val evaluations a run may spend when the user does not say: 100 keeps the default run to minutes on 2 CPU
# cores (its time: docs/results.md#the-default-run-three-seeds); more budget can still pay (--budget).
DEFAULT_BUDGET = 100.0
# Wall seconds `modelopt optimize` gives a run when neither --budget nor --time is said: the whole command under
# 2.5 minutes on 2 CPU cores, the budget above still the cap on a faster machine (docs/results.md#time).
DEFAULT_TIME = 140.0


def default_options(objective: str = "size") -> dict[str, Options]:
    """The tool's compressor options under `objective`, where the user gives none: each registered
    compressor's record with that objective's defaults (`Options.for_objective`).

    Example:
        >>> default_options()["quantize"].bits
        (8, 4, 3)
    """
    return {name: COMPRESSORS.get(name).record.for_objective(objective) for name in COMPRESSORS.names()}


def options_record(name: str, given: Options | Mapping[str, Any] | None, objective: str = "size") -> Options:
    """Compressor `name`'s options record from what a caller gives: None, the tool's defaults under `objective`;
    a record, as it is; a mapping with a `version` (run.json's form, `Options.to_json`), read as that version
    wrote it; a mapping without one, some fields by name over the tool's defaults.

    Raises:
        ConfigError: an unknown compressor or field, a record of another compressor, or a version newer than
            this modelopt's.
    """
    record = COMPRESSORS.get(name).record
    if isinstance(given, Options):
        if not isinstance(given, record):  # another compressor's record would be read field by field, wrongly
            raise ConfigError(f"options of {name} must be a {record.__name__}, got a {type(given).__name__}")
        return given
    if given is not None and "version" in given:
        return record.from_json(given, f"options of {name}")
    return record.for_objective(objective).replace(**(given or {}))


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
    names: Sequence[str] | None = None, options: Mapping[str, Options | Mapping[str, Any]] | None = None,
    model: nn.Module | None = None,
) -> list[Compressor]:
    """Instantiates compressors by registry name with per-compressor options.

    Args:
        names: Registry names; None: the first compressor (quantization) alone.
        options: Per-compressor options, each as `options_record` reads it (a record, a record in JSON form, or
            some fields over the tool's defaults); a compressor without an entry gets the tool's defaults.
        model: The model they will compress: options a compressor derives from it
            (`Routes.model_options`, e.g. early exit's candidate exits) fill in the fields its record
            leaves None.
    """
    options = options or {}
    for name in options:
        COMPRESSORS.get(name)
    out = []
    for n in (FIRST_COMPRESSOR,) if names is None else names:
        cls = COMPRESSORS.get(n)
        record = options_record(n, options.get(n))
        derived = cls.model_options(model) if model is not None and issubclass(cls, Routes) else {}
        out.append(cls(record.replace(**{k: v for k, v in derived.items() if getattr(record, k, None) is None})))
    return out

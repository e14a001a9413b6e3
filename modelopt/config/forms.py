"""The form each field of a run.json must have: a damaged or foreign file is refused in one line
naming the first field that is wrong (`check_forms`), before `RunConfig` reads it. A compressor's
options are checked against the forms of the settings its record declares (`Compressor.record`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from modelopt.compressors import COMPRESSORS
from modelopt.errors import ConfigError, LoadError

__all__ = ["check_forms"]


def _is(*kinds: type) -> Callable[[Any], bool]:
    """isinstance, where a bool passes only when bool is named (JSON's true is no seed)."""
    return lambda v: isinstance(v, kinds) and (not isinstance(v, bool) or bool in kinds)


def _mapping_of_mappings(v: Any) -> bool:
    return isinstance(v, dict) and all(isinstance(o, dict) for o in v.values())


# The form each run.json field must have (null is always allowed: the default then applies).
_FORMS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "model": (_is(str), "a model name"), "weights": (_is(str), "a path or null"), "data": (_is(str), "a data source"),
    "strategy": (_is(str), "a strategy name"), "seed": (_is(int), "an integer"), "objective": (_is(str), "a name"),
    "data_seed": (_is(int), "an integer"), "budget": (_is(int, float), "a number"),
    "time": (_is(int, float), "a number of seconds or null"), "device": (_is(str), "a device"),
    "min_retention": (_is(int, float), "a number"), "confidence": (_is(int, float), "a number"),
    "floors": (lambda v: isinstance(v, list) and all(_is(int, float)(a) for a in v), "a list of numbers"),
    "count_gains": (_is(bool), "true or false"),
    "reconstruct": (_is(bool), "true or false"), "read_as": (_is(dict), "a record of how images were read"),
    "executor": (_is(str), "an executor name"), "workers": (_is(int), "a positive integer"),
    "ray_address": (_is(str), "a Ray address or null"), "knowledge": (_is(str), "a path or null"),
    "unlabeled": (_is(str), "a path or null"), "resize": (_is(int), "a number of pixels or null"),
    "crop": (_is(int), "a number of pixels or null"), "interpolation": (_is(str), "an interpolation name"),
    "mean": (lambda v: isinstance(v, list) and all(_is(int, float)(a) for a in v), "a list of numbers or null"),
    "std": (lambda v: isinstance(v, list) and all(_is(int, float)(a) for a in v), "a list of numbers or null"),
    "compressors": (_mapping_of_mappings, "a mapping of compressor names to their options"),
    "options": (_mapping_of_mappings, "a mapping of compressor names to their options"),
    "fidelity": (lambda v: isinstance(v, dict), "a mapping or null"),
    "latency": (lambda v: isinstance(v, dict), "a mapping or null"),
    "exit_data": (lambda v: isinstance(v, dict) and _is(str)(v.get("path")) and _is(int)(v.get("images")),
                  "null or {path, images}"),  # format 1
}


def check_forms(raw: Mapping[str, Any], where: str) -> None:
    for key, (ok, form) in _FORMS.items():
        if raw.get(key) is not None and not ok(raw[key]):
            raise LoadError(f"{where!r} has {key} = {raw[key]!r}, not {form}; its run.json was damaged or is not a "
                            "modelopt run's")
    for section in ("compressors", "options"):
        for name, options in (raw.get(section) or {}).items():
            if name not in COMPRESSORS:
                continue  # a plugin not installed here: `RunConfig` names it
            for setting in COMPRESSORS.get(name).record.settings():
                if options.get(setting.option) is not None:
                    try:
                        setting.check(options[setting.option], f"{section}.{name}.{setting.option}")
                    except ConfigError as exc:
                        raise LoadError(f"{where!r}: {exc}; its run.json was damaged or is not a modelopt "
                                        "run's") from None

"""The plan file format: a plan's hand-writable YAML form, read and written against a search space.

A plan file names a `default` choice per compressor for every layer that can take it and per-layer `layers`
overrides; model-level keys (``early_exit: {exits, threshold}``) come from compressors that offer a
top-level form. `SearchSpace.parse_plan` / `dump_plan` / `load_plan` / `save_plan` call these.

Example:
    >>> doc = read_plan_file("plan.yaml")
    >>> plan = parse_plan(space, doc)
    >>> save_plan(space, plan, "copy.yaml")
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from modelopt._files import write_atomic
from modelopt.compressors.contract import COMPRESSORS, Choice, Routes
from modelopt.errors import ConfigError, LoadError, UnknownNameError
from modelopt.plan.plan import PLAN_VERSION, Plan, decision_name

if TYPE_CHECKING:
    from modelopt.plan.space import SearchSpace

__all__ = ["check_plan_names", "dump_plan", "load_plan", "parse_plan", "read_plan_file", "save_plan"]

_TOP_KEYS = ("version", "default", "layers")


def parse_plan(space: SearchSpace, doc: Mapping[str, Any]) -> Plan:
    """A plan from its hand-written form: `default` for every layer plus per-layer `layers` overrides.

    Raises:
        ConfigError: an unknown key, a bad version, settings a compressor refuses.
        UnknownNameError: a layer or compressor name the space does not have.
    """
    if not isinstance(doc, Mapping):
        raise ConfigError(f"a plan must be a mapping with keys {', '.join(_TOP_KEYS)}; got {type(doc).__name__}")
    from_top = _top_level_choices(space, doc)
    version = doc.get("version", PLAN_VERSION)
    if isinstance(version, bool) or version != PLAN_VERSION:  # True == 1 in Python, not in a plan file
        raise ConfigError(f"plan version {version!r} is not supported; this modelopt reads version {PLAN_VERSION}")
    default = _compressor_map(space, _or_empty(doc.get("default")), "default")
    overrides = _or_empty(doc.get("layers"))
    if not isinstance(overrides, Mapping):
        raise ConfigError("plan key 'layers' must map layer names to {compressor: settings}")
    for name in overrides:
        if name not in space.layers:
            raise UnknownNameError("layer", name, space.layers)
    choices: dict[str, Choice] = {}
    # A default a layer cannot take (structured pruning on a layer without a channel group, unstructured on the stem)
    # leaves that layer as it is; one that no layer takes is an error, its first refusal the message.
    refused: dict[str, ConfigError] = {}
    taken: set[str] = set()
    for lname, layer in space.layers.items():
        override = _compressor_map(space, _or_empty(overrides.get(lname)), f"layers.{lname}")
        for cname, comp in space.compressors.items():
            raw = _merge(default.get(cname), override[cname]) if cname in override else default.get(cname)
            dname = decision_name(lname, cname)
            if not space.has_decision(dname):
                if raw is not None and cname in override:
                    raise _cannot_take(space, lname, cname)
                continue
            if (lname, cname) in from_top and cname not in override:
                choices[dname] = from_top[(lname, cname)]
                continue
            if cname in override:
                choices[dname] = comp.parse(raw, layer)
                continue
            try:
                choices[dname] = comp.parse(raw, layer)
                taken.add(cname)
            except ConfigError as refusal:
                refused.setdefault(cname, refusal)
    for cname, first in refused.items():
        if cname not in taken:
            raise first
    return space.plan(choices)


def check_plan_names(doc: Mapping[str, Any], layers: Iterable[str], compressors: Iterable[str]) -> None:
    """The layer and compressor names of a plan document, checked against the model's compressible layers and the
    compressors the run may use, as `parse_plan` checks them, before a space exists (before the data are decoded:
    a typo in a plan is one line in a second, not after minutes of reading images). Its settings are checked by
    `parse_plan`.

    Raises:
        ConfigError: `default` or `layers` is not a mapping.
        UnknownNameError: a layer or compressor name the model or the run does not have.
    """
    if not isinstance(doc, Mapping):
        return  # `parse_plan` says what a plan must be
    layers, compressors = set(layers), set(compressors)
    _names_in(_or_empty(doc.get("default")), compressors, "default")
    overrides = _or_empty(doc.get("layers"))
    if not isinstance(overrides, Mapping):
        raise ConfigError("plan key 'layers' must map layer names to {compressor: settings}")
    for name, entry in overrides.items():
        if name not in layers:
            raise UnknownNameError("layer", name, layers)
        _names_in(_or_empty(entry), compressors, f"layers.{name}")


def _names_in(value: Any, compressors: set[str], where: str) -> None:
    if not isinstance(value, Mapping):
        raise ConfigError(f"plan key {where!r} must map compressor names to settings, got {value!r}")
    for cname in value:
        if cname not in compressors:
            raise _unknown_compressor(where, cname, compressors)


def _unknown_compressor(where: str, cname: str, enabled: Iterable[str]) -> ConfigError:
    """A plan entry's compressor this run has not: a registered one (`modelopt list`) is named as such, with the
    flag that adds it; any other name is unknown."""
    enabled = sorted(enabled)
    if cname in COMPRESSORS:
        return ConfigError(f"plan key {where!r} uses the {cname!r} compressor, which this run does not use (enabled: "
                           f"{', '.join(enabled)}); add it: --compressors {','.join([*enabled, cname])}")
    return UnknownNameError(f"compressor in plan key {where!r}", cname, enabled)


def _cannot_take(space: SearchSpace, lname: str, cname: str) -> ConfigError:
    """A layer the compressor offers nothing for: the message names the layers it can take."""
    can = [name for name in space.layers if space.has_decision(decision_name(name, cname))]
    where = f"it can take: {', '.join(can)}" if can else "it takes no layer of this model"
    return ConfigError(f"layer {lname!r} cannot be compressed by {cname!r}; {where}")


def _top_level_choices(space: SearchSpace, doc: Mapping[str, Any]) -> dict[tuple[str, str], Choice]:
    """Model-level settings (early_exit: {exits, threshold}) as per-layer choices; `layers` overrides them."""
    top = {name: c for name, c in space.compressors.items()
           if isinstance(c, Routes) and c.parse_top(None, []) is not None}
    for key in doc:
        if key not in _TOP_KEYS and key not in top:
            valid = (*_TOP_KEYS, *top)
            cls = COMPRESSORS.get(key) if key in COMPRESSORS else None
            if cls is not None and issubclass(cls, Routes) and cls.parse_top is not Routes.parse_top:
                raise ConfigError(f"plan key {key!r} needs the {key!r} compressor, which this run does not "
                                  f"use; enabled: {', '.join(space.compressors)}")
            raise ConfigError(f"unknown plan key {key!r}; valid: {', '.join(valid)}")
    layers = list(space.layers.values())
    return {(lname, cname): c for cname in top if cname in doc
            for lname, c in (top[cname].parse_top(doc[cname], layers) or {}).items()}


def _compressor_map(space: SearchSpace, value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError(f"plan key {where!r} must map compressor names to settings, got {value!r}")
    for cname in value:
        if cname not in space.compressors:
            raise _unknown_compressor(where, cname, space.compressors)
    return dict(value)


def dump_plan(space: SearchSpace, plan: Plan) -> dict[str, Any]:
    """The hand-writable form: the most common choice per compressor as `default`, the rest per layer."""
    per_layer: dict[str, dict[str, Any]] = {lname: {} for lname in space.layers}
    top: dict[str, Any] = {}
    for cname, comp in space.compressors.items():
        if not isinstance(comp, Routes):
            continue
        form = comp.dump_top({d.layer: plan.get(d.name) for d in space.decisions if d.compressor == cname})
        if form is not None:
            top[cname] = form
    for d in space.decisions:
        if d.compressor not in top:
            per_layer[d.layer][d.compressor] = space.compressors[d.compressor].dump(plan.get(d.name))
    default: dict[str, Any] = {}
    for cname in space.compressors:
        seen = [_freeze(v[cname]) for v in per_layer.values() if cname in v]
        if seen:
            common = Counter(seen).most_common(1)[0][0]
            if common is not None:
                default[cname] = _thaw(common)
    layers: dict[str, Any] = {}
    for lname, entries in per_layer.items():
        diff = {c: v for c, v in entries.items() if v != default.get(c)}
        if diff:
            layers[lname] = diff
    return {"version": PLAN_VERSION, **top, "default": default, "layers": layers}


def load_plan(space: SearchSpace, path: str | Path) -> Plan:
    """Reads a plan YAML file (safe_load) into a plan of `space`."""
    return parse_plan(space, read_plan_file(path))


def save_plan(space: SearchSpace, plan: Plan, path: str | Path) -> None:
    """Writes `plan` in its hand-writable form (atomically: a crash leaves the old file or the new)."""
    write_atomic(path, yaml.safe_dump(dump_plan(space, plan), sort_keys=False))


def read_plan_file(path: str | Path) -> dict[str, Any]:
    """A plan YAML file's document (safe_load), checked as far as it can be without the model.

    Raises:
        LoadError: the file does not exist or is a folder.
        ConfigError: it is not valid YAML, or not a mapping.
    """
    path = Path(path)
    if not path.exists():
        raise LoadError(f"plan file {str(path)!r} does not exist")
    if not path.is_file():
        raise LoadError(f"plan file {str(path)!r} is a folder; pass a YAML file")
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        why = " ".join(str(getattr(exc, "problem", None) or exc).split())  # PyYAML's ReaderError text has lines
        raise ConfigError(f"plan file {str(path)!r} is not valid YAML{where}: {why}") from None
    except (UnicodeDecodeError, OSError) as exc:
        raise LoadError(f"cannot read plan file {str(path)!r} as text: {exc}") from None
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise ConfigError(f"plan file {str(path)!r} holds a {type(doc).__name__}, not a plan (a mapping with "
                          "'default' and 'layers')")
    return doc


def _or_empty(value: Any) -> Any:
    """A key written with no value (`layers:`) means empty; other non-mappings stay to be refused."""
    return {} if value is None else value


def _merge(base: Any, override: Any) -> Any:
    if isinstance(base, Mapping) and isinstance(override, Mapping):
        return {**base, **override}
    return override


def _freeze(v: Any) -> Any:
    return tuple(sorted(v.items())) if isinstance(v, dict) else v


def _thaw(v: Any) -> Any:
    return dict(v) if isinstance(v, tuple) else v

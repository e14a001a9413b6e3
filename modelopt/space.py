"""The search space: ordered decisions from the compressors' menus, and the plan file format."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from modelopt._files import write_atomic
from modelopt.compressors._base import Choice, Compressor
from modelopt.compressors._registry import COMPRESSORS
from modelopt.errors import ConfigError, LoadError, UnknownNameError
from modelopt.layers import Layer
from modelopt.plan import PLAN_VERSION, Decision, Plan, decision_name

_TOP_KEYS = ("version", "default", "layers")


@dataclass(frozen=True)
class ChoiceFeatures:
    """What is known about one choice before any evaluation (strategies' priors use it)."""

    bytes: int  # packed bytes of the layer's weight under this choice
    bits: int  # weight bits arithmetic runs at (32 = float)
    macs: int  # the layer's multiply-accumulates per sample, less what the choice saves (an estimate)
    error: float  # relative squared error of the weight, or of the layer's output (Evaluator.measure_errors)
    act_bits: int = 32  # bits of the layer's input activations (32 = float)


class SearchSpace:
    """Per-layer decisions offered by `compressors` for `layers`, in layer order.

    Example:
        >>> space = SearchSpace(workload.layers, [Quantize(bits=(8, 4))])
        >>> plan = space.parse_plan({"default": {"quantize": {"bits": 8}}})
    """

    def __init__(self, layers: Sequence[Layer], compressors: Sequence[Compressor]) -> None:
        self.layers = {layer.name: layer for layer in layers}
        # Chain order is the compressors' own (prune before quantize), not the order given.
        compressors = sorted(compressors, key=lambda c: c.order)
        self.compressors = {c.name: c for c in compressors}
        decisions = []
        for layer in layers:
            for comp in compressors:
                menu = comp.menu(layer)
                if len(menu) > 1:
                    decisions.append(Decision(decision_name(layer.name, comp.name), comp.name, layer.name, tuple(menu)))
        self.decisions: tuple[Decision, ...] = tuple(decisions)
        self._by_name = {d.name: d for d in self.decisions}
        # Data-free estimates; Evaluator.measure_errors() replaces `error` with measured values.
        self.features: dict[str, tuple[ChoiceFeatures, ...]] = {d.name: self._estimate(d) for d in self.decisions}

    def _estimate(self, d: Decision) -> tuple[ChoiceFeatures, ...]:
        comp, layer = self.compressors[d.compressor], self.layers[d.layer]  # type: ignore[index]
        out = []
        for c in d.choices:
            bits = comp.weight_bits(c)
            err = 0.0 if c is None else 4.0 ** -min(bits, 16)  # uniform-quantizer error scales as 4^-bits
            out.append(ChoiceFeatures(comp.weight_bytes(layer, c) + comp.added_bytes(layer, c), bits,
                                      layer.macs - comp.macs_saved(layer, c, self.layers), err, comp.activation_bits(c)))
        return tuple(out)

    def __len__(self) -> int:
        return len(self.decisions)

    @property
    def cardinality(self) -> int:
        return math.prod(len(d.choices) for d in self.decisions)

    def decision(self, name: str) -> Decision:
        try:
            return self._by_name[name]
        except KeyError:
            raise UnknownNameError("decision", name, self._by_name) from None

    def plan(self, choices: Mapping[str, Choice] | None = None) -> Plan:
        """A plan from {decision name: choice}; decisions not named are off (None)."""
        choices = dict(choices or {})
        for name in choices:
            self.decision(name)
        return Plan(tuple((d.name, choices.get(d.name)) for d in self.decisions))

    def anchor(self, max_error: float = 1e-3) -> Plan:
        """The safest compressed plan: every layer at its most accurate lower-bit weight choice whose
        relative weight error is at most `max_error` (INT8 in practice), every other decision off.

        Example:
            >>> space.anchor()  # int8 per-channel (or group) on every layer
        """
        chosen = {}
        for d in self.decisions:
            feats = self.features[d.name]
            ok = [(f.error, f.act_bits != 32, f.bytes, i) for i, (c, f) in enumerate(zip(d.choices, feats))
                  if c is not None and f.bits < 32 and f.error <= max_error]
            if ok:
                chosen[d.name] = d.choices[min(ok)[3]]
        return self.plan(chosen)

    def uniform(self, compressor: str, choice: Choice) -> Plan:
        """The plan giving every layer the same `choice` of `compressor` (canonicalised per layer)."""
        comp = self.compressors[compressor]
        raw = comp.dump(choice)
        return self.plan(
            {d.name: comp.parse(raw, self.layers[d.layer]) for d in self.decisions if d.compressor == compressor and d.layer}
        )

    # ---- the plan file format -------------------------------------------------------------

    def parse_plan(self, doc: Mapping[str, Any]) -> Plan:
        """A plan from its hand-written form: `default` for every layer plus per-layer `layers` overrides."""
        if not isinstance(doc, Mapping):
            raise ConfigError(f"a plan must be a mapping with keys {', '.join(_TOP_KEYS)}; got {type(doc).__name__}")
        top = {name: c for name, c in self.compressors.items() if c.parse_top(None, []) is not None}
        for key in doc:
            if key not in _TOP_KEYS and key not in top:
                valid = (*_TOP_KEYS, *top)
                if key in COMPRESSORS and COMPRESSORS.get(key).parse_top is not Compressor.parse_top:
                    raise ConfigError(f"plan key {key!r} needs the {key!r} compressor, which this run does not "
                                      f"use; enabled: {', '.join(self.compressors)}")
                raise ConfigError(f"unknown plan key {key!r}; valid: {', '.join(valid)}")
        # Model-level settings (early_exit: {exits, threshold}) as per-layer choices; `layers` overrides them.
        from_top = {(lname, cname): c for cname in top if cname in doc
                    for lname, c in (top[cname].parse_top(doc[cname], list(self.layers.values())) or {}).items()}
        version = doc.get("version", PLAN_VERSION)
        if isinstance(version, bool) or version != PLAN_VERSION:  # True == 1 in Python, not in a plan file
            raise ConfigError(f"plan version {version!r} is not supported; this modelopt reads version {PLAN_VERSION}")
        default = self._compressor_map(_or_empty(doc.get("default")), "default")
        overrides = _or_empty(doc.get("layers"))
        if not isinstance(overrides, Mapping):
            raise ConfigError("plan key 'layers' must map layer names to {compressor: settings}")
        for name in overrides:
            if name not in self.layers:
                raise UnknownNameError("layer", name, self.layers)
        choices: dict[str, Choice] = {}
        for lname, layer in self.layers.items():
            override = self._compressor_map(_or_empty(overrides.get(lname)), f"layers.{lname}")
            for cname, comp in self.compressors.items():
                raw = _merge(default.get(cname), override[cname]) if cname in override else default.get(cname)
                dname = decision_name(lname, cname)
                if dname not in self._by_name:
                    if raw is not None and cname in override:
                        raise ConfigError(f"layer {lname!r} cannot be compressed by {cname!r}")
                    continue
                if (lname, cname) in from_top and cname not in override:
                    choices[dname] = from_top[(lname, cname)]
                    continue
                choices[dname] = comp.parse(raw, layer)
        return self.plan(choices)

    def _compressor_map(self, value: Any, where: str) -> dict[str, Any]:
        if not isinstance(value, Mapping):
            raise ConfigError(f"plan key {where!r} must map compressor names to settings, got {value!r}")
        for cname in value:
            if cname not in self.compressors:
                raise UnknownNameError(f"compressor in plan key {where!r}", cname, self.compressors)
        return dict(value)

    def dump_plan(self, plan: Plan) -> dict[str, Any]:
        """The hand-writable form: the most common choice per compressor as `default`, the rest per layer."""
        per_layer: dict[str, dict[str, Any]] = {lname: {} for lname in self.layers}
        top: dict[str, Any] = {}
        for cname, comp in self.compressors.items():
            form = comp.dump_top({d.layer: plan.get(d.name) for d in self.decisions if d.compressor == cname})
            if form is not None:
                top[cname] = form
        for d in self.decisions:
            if d.layer is not None and d.compressor not in top:
                per_layer[d.layer][d.compressor] = self.compressors[d.compressor].dump(plan.get(d.name))
        default: dict[str, Any] = {}
        for cname in self.compressors:
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

    def load_plan(self, path: str | Path) -> Plan:
        """Reads a plan YAML file (safe_load)."""
        return self.parse_plan(read_plan_file(path))

    def save_plan(self, plan: Plan, path: str | Path) -> None:
        write_atomic(path, yaml.safe_dump(self.dump_plan(plan), sort_keys=False))

    def plan_from_flat(self, flat: Mapping[str, Any]) -> Plan:
        """Inverse of `Plan.to_flat` (the journal's form)."""
        choices = {}
        for name, raw in flat.items():
            d = self.decision(name)
            choices[name] = self.compressors[d.compressor].parse(raw, self.layers[d.layer]) if d.layer else raw
        return self.plan(choices)


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

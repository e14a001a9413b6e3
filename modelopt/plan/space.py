"""The search space: ordered per-layer decisions from the compressors' menus.

The plan file format lives in `modelopt.plan.file`; `read_plan_file` is re-exported here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from modelopt.compressors.contract import (
    BranchAnalysis,
    Choice,
    Compressor,
    RemovesBranch,
    RemovesChannels,
    Routes,
    UsesAnalyses,
)
from modelopt.errors import UnknownNameError
from modelopt.model.analysis import Layers
from modelopt.model.layers import Layer
from modelopt.plan import file as plan_file
from modelopt.plan.file import read_plan_file
from modelopt.plan.plan import Decision, Plan, decision_name, jsonable

__all__ = ["ANCHOR_BITS", "HEDGE_BYTES", "ChoiceFeatures", "SearchSpace", "read_plan_file"]

# The plans between a narrow anchor and INT8 (`SearchSpace.hedges`): the narrow plan with its most sensitive layers
# widened until its bytes grow by these shares of the gap to INT8, so that a narrow anchor failing its confirmation
# falls back one step, not to INT8.
HEDGE_BYTES = (0.15, 0.35)

# Widths of the uniform anchor plans scored beside every search (besides INT8): the no-search answers a search must
# beat (uniform INT4 with GPTQ holds the floor on every model and data tried here: docs/results.md, its GPTQ table).
ANCHOR_BITS = (4, 3)


@dataclass(frozen=True)
class ChoiceFeatures:
    """What is known about one choice before any evaluation (strategies' priors use it)."""

    bytes: int  # packed bytes of the layer's weight under this choice
    bits: int  # weight bits arithmetic runs at (32 = float)
    macs: int  # the layer's multiply-accumulates per sample, less what the choice saves (an estimate)
    error: float  # relative squared error of the weight, or of the layer's output (Evaluator.measure_errors)
    act_bits: int = 32  # bits of the layer's input activations (32 = float)
    latency: float = math.nan  # estimated ms per batch it costs in the run's engine (`modelopt.latency.cost_model`)


class SearchSpace:
    """Per-layer decisions offered by `compressors` for `layers`, in layer order.

    Example:
        >>> space = SearchSpace(workload.layers, [Quantize(bits=(8, 4))])
        >>> plan = space.parse_plan({"default": {"quantize": {"bits": 8}}})
    """

    def __init__(self, layers: Sequence[Layer], compressors: Sequence[Compressor]) -> None:
        # Chain order is the compressors' own (prune before quantize), not the order given.
        compressors = sorted(compressors, key=lambda c: c.order)
        if isinstance(layers, Layers):  # a model's: given what the analyses these menus read find (each built once)
            layers = layers.analysed(*dict.fromkeys(a for c in compressors if isinstance(c, UsesAnalyses)
                                                    for a in c.analyses))
        self.layers = {layer.name: layer for layer in layers}
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
        # (decision, choice) -> bits a stored value takes once coded, measured on the layer's codes under that
        # choice alone (`measure_errors`); the cost model prices plans not yet built by it.
        self.value_rates: dict[tuple[str, Choice], float] = {}

    def _estimate(self, d: Decision) -> tuple[ChoiceFeatures, ...]:
        comp, layer = self.compressors[d.compressor], self.layers[d.layer]
        out = []
        for c in d.choices:
            precision = comp.precision(c)
            err = 0.0 if c is None else 4.0 ** -min(precision.weight, 16)  # uniform-quantizer error scales as 4^-bits
            macs = layer.macs - (comp.macs_saved(layer, c, self.layers) if isinstance(comp, RemovesChannels) else 0)
            if isinstance(comp, RemovesBranch) and comp.removes(c):  # the whole branch's MACs go
                macs = layer.macs - sum(self.layers[n].macs for n in BranchAnalysis.of(layer) if n in self.layers)
            head = comp.added_bytes(layer, c) if isinstance(comp, Routes) else 0
            out.append(ChoiceFeatures(comp.weight_bytes(layer, c) + head, precision.weight, macs, err,
                                      precision.activation))
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

    def has_decision(self, name: str) -> bool:
        return name in self._by_name

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
            ok = [(f.error, f.act_bits != 32, f.bytes, i) for i, (c, f) in enumerate(zip(d.choices, feats, strict=True))
                  if c is not None and f.bits < 32 and f.error <= max_error and getattr(c, "rate", None) is None]
            if ok:
                chosen[d.name] = d.choices[min(ok)[3]]
        return self.plan(chosen)

    def anchors(self, widths: Sequence[int] = ANCHOR_BITS, act_bits: int = 32) -> tuple[Plan, ...]:
        """The uniform plans every run scores beside its search, safest first: `anchor()` (INT8), then
        each narrower width of `widths` the menus offer, every layer that offers it at that width with
        the fewest bytes (per channel rather than group-wise scales) and, among those, the smallest
        error (GPTQ codes where offered), every other decision off. A search that reports less than
        a confirmed anchor has failed, and confirmation tests them first (`modelopt.certify.confirm`).

        `act_bits` < 32: the plans with inputs quantized to that width too (integer kernels), at each of
        `widths` (the INT8 anchor not first).

        Example:
            >>> len(space.anchors())  # INT8, INT4 and INT3 per channel, when quantize offers them
            3
        """
        plans = [self.anchor()] if self.decisions and act_bits == 32 else []
        for width in widths:
            chosen = {}
            for d in self.decisions:
                feats = self.features[d.name]
                # INT-b grids alone: a rate grid (`rate`) runs at its rate's ceiling but is no grid of 2^b levels.
                ok = [(f.bytes, f.error, i) for i, (c, f) in enumerate(zip(d.choices, feats, strict=True))
                      if c is not None and f.bits == width and f.act_bits == act_bits
                      and getattr(c, "rate", None) is None]
                if ok:
                    chosen[d.name] = d.choices[min(ok)[2]]
            plan = self.plan(chosen)
            if chosen and all(plan.key != p.key for p in plans):
                plans.append(plan)
        return tuple(plans)

    def hedges(self, narrow: Plan, shares: Sequence[float] = HEDGE_BYTES) -> tuple[Plan, ...]:
        """`narrow` (an anchor) with its most sensitive layers at 8 bits: layers widened in decreasing order of
        the output error each saves per byte it costs (`ChoiceFeatures.error`, measured by
        `Evaluator.measure_errors`), until the plan's bytes have grown by each of `shares` of the gap between
        `narrow` and INT8 (`anchor()`); most compressed first, none where nothing can be widened.

        Example:
            >>> int4 = space.anchors()[1]
            >>> [p.key for p in space.hedges(int4)]  # INT4 with 15 % and 35 % of the way to INT8 spent
        """
        safe = self.anchor()
        widen: list[tuple[float, int, str, Choice]] = []
        for d in self.decisions:
            now, wide = narrow.get(d.name), safe.get(d.name)
            if now is None or wide is None or now == wide:
                continue
            f_now, f_wide = (self.features[d.name][d.choices.index(c)] for c in (now, wide))
            extra = f_wide.bytes - f_now.bytes
            if extra > 0 and f_wide.error < f_now.error:
                widen.append(((f_now.error - f_wide.error) / extra, extra, d.name, wide))
        widen.sort(key=lambda w: (-w[0], w[2]))
        gap = sum(w[1] for w in widen)
        plans: list[Plan] = []
        for share in sorted(shares):
            spent, chosen = 0, dict(narrow.choices)
            for _, extra, name, wide in widen:
                if spent >= share * gap:
                    break
                chosen[name], spent = wide, spent + extra
            plan = self.plan(chosen)
            if spent and plan.key != safe.key and all(plan.key != p.key for p in plans):
                plans.append(plan)
        return tuple(plans)

    def removed_branches(self, plan: Plan) -> tuple[str, ...]:
        """The layers ending a residual branch the plan removes (`RemovesBranch`: depth), in model order."""
        return tuple(d.layer for d in self.decisions
                     if isinstance(comp := self.compressors[d.compressor], RemovesBranch)
                     and comp.removes(plan.get(d.name)))

    def skipped_layers(self, plan: Plan) -> frozenset[str]:
        """Every layer on the residual branches the plan removes (`BranchAnalysis`): stored, never run."""
        return frozenset(name for end in self.removed_branches(plan) for name in BranchAnalysis.of(self.layers[end]))

    def uniform(self, compressor: str, choice: Choice) -> Plan:
        """The plan giving every layer the same `choice` of `compressor` (canonicalised per layer)."""
        comp = self.compressors[compressor]
        raw = comp.dump(choice)
        return self.plan(
            {d.name: comp.parse(raw, self.layers[d.layer]) for d in self.decisions if d.compressor == compressor}
        )

    # ---- the plan file format (modelopt.plan.file) ----------------------------------------

    def parse_plan(self, doc: Mapping[str, Any]) -> Plan:
        """A plan from its hand-written form (`modelopt.plan.file.parse_plan`)."""
        return plan_file.parse_plan(self, doc)

    def dump_plan(self, plan: Plan) -> dict[str, Any]:
        """The hand-writable form of `plan` (`modelopt.plan.file.dump_plan`)."""
        return plan_file.dump_plan(self, plan)

    def load_plan(self, path: str | Path) -> Plan:
        """Reads a plan YAML file (safe_load)."""
        return plan_file.load_plan(self, path)

    def save_plan(self, plan: Plan, path: str | Path) -> None:
        plan_file.save_plan(self, plan, path)

    def plan_from_flat(self, flat: Mapping[str, Any]) -> Plan:
        """Inverse of `Plan.to_flat` (the journal's form): the menu's choice of that JSON form, else
        what the compressor parses from it (a record written before a choice's fields changed)."""
        choices = {}
        for name, raw in flat.items():
            d = self.decision(name)
            on_menu = [c for form, c in self._json_menus[name] if form == raw]
            choices[name] = on_menu[0] if on_menu else self.compressors[d.compressor].parse(raw, self.layers[d.layer])
        return self.plan(choices)

    @cached_property
    def _json_menus(self) -> dict[str, list[tuple[Any, Choice]]]:
        """Each decision's menu with the JSON form of each choice (`jsonable`), for reading journals."""
        return {d.name: [(jsonable(c), c) for c in d.choices] for d in self.decisions}


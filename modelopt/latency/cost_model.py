"""The latency cost model the strategies' priors read when the objective is measured latency.

A layer costs its multiply-accumulates times a rate that depends on how the engine runs it: in float
(no quantization), as integer kernels (8-bit weights and quantized inputs: QLinearConv in ONNX Runtime),
or dequantized (quantized weights with float inputs, or weights under 5 bits: the engine turns them back
into float on every call, then runs a float kernel, which costs more than float itself). A plan costs a
fixed overhead, plus a fixed cost per early exit (its head, and where the engine runs segments, one more
call and a split of the batch), plus the sum over its layers:

    latency(plan) ~ overhead + per_exit * exits(plan) + sum_kind rate[kind] * MACs[kind](plan)

The rates are fitted (least squares, non-negative) on the plans the run has measured: at the start the
uniform anchors (float, INT8 with float inputs, INT8 with quantized inputs, and, when the menus offer exits,
the last of them with one exit), then every trial's measured latency. Each choice of a quantizing decision is
priced at its layer's MACs times the rate of the kind it selects (off: float); a pruning choice at what its
saved MACs cost (negative: a saving), at the integer rate when the menus offer integer kernels, else the
float rate; a removed residual branch (depth) at what its layers' MACs cost; an exit at the expected MACs its
leavers skip (at that rate) less its fixed cost. Without the
fixed cost every exit looks free and the rollouts turn on every one offered.

Example:
    >>> model = LatencyModel(space)
    >>> model.observe(space.plan(), 0.66); model.observe(int8_plan, 0.41)
    >>> model.apply()                     # space.features[...].latency, in ms per batch
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from modelopt.compressors.contract import RemovesBranch, Routes
from modelopt.plan.plan import Plan
from modelopt.plan.space import ChoiceFeatures, SearchSpace

__all__ = ["KINDS", "LatencyModel", "kind_of", "routes"]

KINDS = ("float", "integer", "dequantized")
INTEGER_BITS = range(5, 9)  # weight widths stored as int8 (5..8): integer kernels when the inputs are quantized


def routes(space: SearchSpace, decision: str) -> bool:
    """Whether a decision's choices route samples (early exits: a fixed cost each, a saving by their leavers)."""
    return isinstance(space.compressors[space.decision(decision).compressor], Routes)


def kind_of(f: ChoiceFeatures) -> str:
    """How an engine runs a layer under a choice with these features."""
    if f.bits >= 32:
        return "float"
    return "integer" if f.bits in INTEGER_BITS and f.act_bits < 32 else "dequantized"


class LatencyModel:
    """Per-kind rates (ms per MAC) and an overhead, fitted on measured plans of `space`."""

    def __init__(self, space: SearchSpace) -> None:
        self.space = space
        # [1, MACs float, MACs integer, MACs dequantized, exits] per measured plan
        self.rows: list[np.ndarray] = []
        self.ms: list[float] = []
        self.coef: np.ndarray | None = None  # overhead, one rate per kind, the cost of one exit

    def features(self, plan: Plan) -> np.ndarray:
        """[1, MACs run in float, as integer kernels, dequantized, exits] of `plan` (a layer's MACs: its pruned
        MACs, at the kind its quantization gives it; an exit's expected saving comes off its layer's kind)."""
        out = np.zeros(2 + len(KINDS))
        out[0] = 1.0
        macs: dict[str, float] = {name: float(layer.macs) for name, layer in self.space.layers.items()}
        skipped: dict[str, float] = dict.fromkeys(self.space.layers, 0.0)
        kinds: dict[str, str] = dict.fromkeys(self.space.layers, "float")
        gone = self.space.skipped_layers(plan)  # the layers of removed residual branches: never run
        for d in self.space.decisions:
            choice = plan.get(d.name)
            if choice not in d.choices:  # a plan from a file, with a choice the menu does not offer: unpriced
                continue
            f = self.space.features[d.name][d.choices.index(choice)]
            layer = self.space.layers[d.layer]
            if isinstance(self.space.compressors[d.compressor], RemovesBranch):
                continue  # priced through `gone`
            if routes(self.space, d.name):
                # The layers after the exit run for fewer samples: more MACs than this layer has.
                skipped[d.layer] += layer.macs - f.macs
                out[-1] += choice is not None
                continue
            macs[d.layer] -= layer.macs - f.macs  # what the choice saves (structured pruning)
            if f.bits < 32:
                kinds[d.layer] = kind_of(f)
        for name, m in macs.items():
            if name not in gone:
                out[1 + KINDS.index(kinds[name])] += max(m, 0.0) - skipped[name]
        return out

    def observe(self, plan: Plan, ms: float) -> None:
        """A measured plan; the rates are refitted on every measured plan (`fit`)."""
        if math.isfinite(ms) and ms > 0:
            self.rows.append(self.features(plan))
            self.ms.append(float(ms))
            self.fit()

    def fit(self) -> None:
        """Non-negative least squares on the measured plans; a kind no measured plan ran takes the float rate,
        and exits, until a plan with one was measured, the overhead of a whole plan (a second call's worth)."""
        if not self.rows:
            return
        a, b = np.stack(self.rows), np.array(self.ms)
        used: np.ndarray = np.asarray(a.any(axis=0), dtype=bool)
        coef = np.zeros(a.shape[1])
        coef[used] = _nnls(a[:, used], b)
        float_rate = coef[1] if used[1] else (b / np.maximum(a[:, 1:-1].sum(axis=1), 1.0)).mean()
        for k in range(1, a.shape[1] - 1):
            if not used[k]:
                coef[k] = float_rate
        if not used[-1]:
            coef[-1] = coef[0]
        self.coef = coef

    def predict(self, plan: Plan) -> float:
        """The plan's estimated latency (ms); nan before any plan was measured."""
        return math.nan if self.coef is None else float(self.features(plan) @ self.coef)

    def apply(self) -> None:
        """Each choice's prior latency (ms) into the space's features (`ChoiceFeatures.latency`)."""
        if self.coef is None:
            return
        rates = dict(zip(KINDS, self.coef[1:-1], strict=True))
        per_exit = float(self.coef[-1])
        # What a MAC removed saves: at the integer rate when the menus offer integer kernels (the plans that
        # matter run there), else at the float rate.
        offers_integer = any(kind_of(f) == "integer" for fs in self.space.features.values() for f in fs)
        saving = rates["integer"] if offers_integer else rates["float"]
        for d in self.space.decisions:
            layer = self.space.layers[d.layer]
            feats = self.space.features[d.name]
            if routes(self.space, d.name):
                self.space.features[d.name] = tuple(
                    dataclasses.replace(f, latency=0.0 if c is None else per_exit - saving * (layer.macs - f.macs))
                    for c, f in zip(d.choices, feats, strict=True))
                continue
            quantizes = any(f.bits < 32 for f in feats)  # the decision sets how the layer runs (off: float)
            self.space.features[d.name] = tuple(
                dataclasses.replace(f, latency=float(rates[kind_of(f)] * layer.macs if quantizes
                                                     else -saving * (layer.macs - f.macs)))
                for f in feats)


def _nnls(a: np.ndarray, b: np.ndarray, iterations: int = 500) -> np.ndarray:
    """min |a x - b| over x >= 0 (projected gradient on the scaled problem; a few columns, few rows)."""
    scale = np.maximum(np.abs(a).max(axis=0), 1e-12)
    s = a / scale
    x, *_ = np.linalg.lstsq(s, b, rcond=None)
    x = np.maximum(x, 0.0)
    step = 1.0 / max(np.linalg.norm(s, 2) ** 2, 1e-12)
    for _ in range(iterations):
        x = np.maximum(x - step * (s.T @ (s @ x - b)), 0.0)
    return x / scale

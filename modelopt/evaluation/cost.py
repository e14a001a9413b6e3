"""One cost accounting: a plan's bytes, MACs and bitops, per layer and in total (docs/certification.md, Numbers).

Everything that prices a plan reads it from here: the evaluator's `size_bytes`, `macs` and
`bitops`, the strategies' cost models (`search/knapsack.py`) and the report's per-layer map
(`RunFolder.layer_bytes`). It needs the layers, the compressors and the plan, never the model.

- A layer's weight is stored as its compressors' chain makes it (`Compressor.stored`, in
  chain order: prune, then quantize), in the shape structured pruning leaves (the layer's own
  kept output channels, its producer's kept input channels).
- A layer's `bytes` are its packed weight, plus the exit head an early exit adds after it
  (`Routes.added_bytes`), less the float norm and bias entries its removed channels take with
  them. The float tensors outside the weights (biases, norms) are `PlanCost.other_bytes` at full
  size, so `other_bytes + sum(layer bytes)` is size_bytes exactly.
- MACs shrink with the kept channels (out x in), and are zero on a removed residual branch (depth: its layers are
  still stored, never run); bitops are MACs x weight bits x input bits.
  With early exit, `reach` (the share of samples that ran each layer) and the heads' mean MACs
  come from a forward pass; the arithmetic on them is here.

Example:
    >>> costs = CostModel(space, workload.other_bytes)
    >>> c = costs.cost(plan)
    >>> c.size_bytes, c.macs(), c.bitops(), c.layer_bytes()["layer1.0.conv1"]
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from modelopt.compressors.contract import ChannelAnalysis, Choice, RemovesChannels, Routes, Storage
from modelopt.model.layers import Layer
from modelopt.plan.plan import Decision, Plan
from modelopt.plan.space import SearchSpace

__all__ = ["CostModel", "LayerCost", "PlanCost"]


@dataclass(frozen=True)
class LayerCost:
    """What a plan makes one layer cost.

    Attributes:
        layer: The layer as the plan stores and runs it (kept channels in `weight_shape`, MACs scaled).
        storage: How its weight is stored (`Storage`, after the whole chain).
        head_bytes: Float32 bytes of what its choices add outside the weight (an exit head).
        freed_bytes: Float32 bytes of the norm and bias entries its removed output channels drop.
        weight_bits: Bits the weight's arithmetic runs at (32: float).
        activation_bits: Bits of its input activations (32: float).
    """

    layer: Layer
    storage: Storage
    head_bytes: int
    freed_bytes: int
    weight_bits: int
    activation_bits: int

    @property
    def bytes(self) -> int:
        """Packed weight, plus heads, less the float entries removed channels drop."""
        return self.storage.bytes + self.head_bytes - self.freed_bytes

    @property
    def decoded_bytes(self) -> int:
        """`bytes` with the weight as decoded (`Storage.decoded_bytes`): what it takes in memory once loaded."""
        return self.storage.decoded_bytes + self.head_bytes - self.freed_bytes

    @property
    def macs(self) -> int:
        return self.layer.macs

    @property
    def bitops(self) -> int:
        return self.layer.macs * self.weight_bits * self.activation_bits


@dataclass(frozen=True)
class PlanCost:
    """A plan's costs, layer by layer; totals are sums of the layers' (meanings: docs/certification.md, Numbers).

    Attributes:
        layers: One `LayerCost` per compressible layer, in the model's order.
        other_bytes: Float32 bytes of the tensors outside the compressible weights (biases,
            folded norms), every channel counted: removed ones come off the layers' `bytes`.
    """

    layers: tuple[LayerCost, ...]
    other_bytes: int

    @property
    def size_bytes(self) -> int:
        return self.other_bytes + sum(x.bytes for x in self.layers)

    @property
    def decoded_bytes(self) -> int:
        """The weights' bytes once decoded into their fixed-rate containers (int8, INT4 two to a byte), the float
        tensors as stored: what the file holds before entropy coding."""
        return self.other_bytes + sum(x.decoded_bytes for x in self.layers)

    def layer(self, name: str) -> LayerCost:
        """The cost of the layer named `name`."""
        return next(x for x in self.layers if x.layer.name == name)

    def layer_bytes(self) -> dict[str, int]:
        """{layer: its `LayerCost.bytes`}; with `other_bytes`, they sum to `size_bytes`."""
        return {x.layer.name: x.bytes for x in self.layers}

    def macs(self, reach: Mapping[str, float] | None = None, head_macs: float = 0.0) -> int:
        """MACs per sample; `reach`: the share of samples that ran each layer, `head_macs`: the exit
        heads' mean MACs per sample (early exit; both from the forward pass)."""
        return round(sum(x.macs * (1.0 if reach is None else reach[x.layer.name]) for x in self.layers) + head_macs)

    def bitops(self, reach: Mapping[str, float] | None = None, head_macs: float = 0.0) -> int:
        """Bit operations per sample (heads run in float: 32 x 32 per MAC)."""
        return round(sum(x.bitops * (1.0 if reach is None else reach[x.layer.name]) for x in self.layers)) + round(
            head_macs * 32 * 32)


class CostModel:
    """Prices plans of one search space.

    Args:
        space: The layers, compressors and decisions.
        other_bytes: Float32 bytes outside the compressible weights (`Workload.other_bytes`;
            a run folder: float_size_bytes - 4 x the layers' parameters).

    Example:
        >>> CostModel(space, wl.other_bytes).cost(plan).size_bytes == evaluator.plan_cost(plan).size_bytes
        True
    """

    def __init__(self, space: SearchSpace, other_bytes: int = 0) -> None:
        self.space = space
        self.other_bytes = other_bytes
        self.layers = tuple(space.layers.values())
        self.decisions: dict[str, list[Decision]] = {x.name: [] for x in self.layers}
        for d in space.decisions:
            self.decisions[d.layer].append(d)
        self.roots = [x.name for x in self.layers if ChannelAnalysis.of(x).members]  # channel groups' roots
        self._counts: dict[tuple[str, str, Choice], int | None] = {}

    def cost(self, plan: Plan, kept: Mapping[str, int] | None = None,
             coded: Mapping[str, int] | None = None) -> PlanCost:
        """The plan's costs.

        Args:
            plan: A plan of the space.
            kept: {root layer: output channels kept} for the channel groups structured pruning shrinks; None:
                counted from the compressors (`kept_counts`), as when no weights are at hand.
            coded: {layer: bytes its stored values take coded} measured on the plan's codes
                (`modelopt.evaluation.coded`: the evaluator's exact prices); None: estimated from each choice's
                measured rate (`SearchSpace.value_rates`), or its fixed rate where none was measured.
        """
        kept = self.kept_counts(plan) if kept is None else kept
        removed: dict[str, list[int]] = {}  # layer -> [rows removed, columns removed]
        for root, n in kept.items():
            layer = self.space.layers[root]
            for member, rows in ChannelAnalysis.of(layer).members:
                removed.setdefault(member, [0, 0])[0 if rows else 1] += layer.out_channels - n
        skipped = self.space.skipped_layers(plan)
        costs = []
        for x in self.layers:
            gone_rows, gone_cols = removed.get(x.name, (0, 0))
            cost = self.layer_cost(x, {d.name: plan.get(d.name) for d in self.decisions[x.name]},
                                   x.out_channels - gone_rows if gone_rows else None,
                                   x.in_channels - gone_cols if gone_cols else None,
                                   None if coded is None else coded.get(x.name, -1))
            if x.name in skipped:  # on a removed branch: stored as before (the packed form), never run
                cost = dataclasses.replace(cost, layer=dataclasses.replace(cost.layer, macs=0))
            costs.append(cost)
        return PlanCost(tuple(costs), self.other_bytes)

    def layer_cost(self, layer: Layer, choices: Mapping[str, Choice], out: int | None = None,
                   inp: int | None = None, coded: int | None = None) -> LayerCost:
        """One layer's cost under its decisions' `choices` {decision name: choice}.

        Args:
            out: Output channels kept (structured pruning of a group this layer's rows are in); None: all.
            inp: Input channels kept (of a group its columns are in); None: all.
            coded: The bytes its stored values take coded, measured on its codes (-1: stored as dense float32);
                None: estimated from the measured rates of its choices.
        """
        stored = _stored_layer(layer, out, inp)
        storage = Storage(stored.weight_shape)
        head = 0
        weight_bits = activation_bits = 32
        rate = None
        for d in self.decisions[layer.name]:
            comp, c = self.space.compressors[d.compressor], choices.get(d.name)
            storage = comp.stored(stored, c, storage)
            rate = self.space.value_rates.get((d.name, c), rate)
            if c is not None and isinstance(comp, Routes):
                head += comp.added_bytes(layer, c)
            precision = comp.precision(c)
            weight_bits = min(weight_bits, precision.weight)
            activation_bits = min(activation_bits, precision.activation)
        if coded is not None:
            storage = storage if coded < 0 else dataclasses.replace(storage, coded=coded)
        elif rate is not None and storage.value_bits < 32:
            values = storage.numel if storage.kept is None else storage.kept
            storage = dataclasses.replace(storage, coded=math.ceil(values * rate / 8) + storage.index_bytes)
        freed = 0
        if ChannelAnalysis.of(layer).members:
            # A root's removed channels take their group's float entries with them (norms' scales and shifts,
            # biases): counted here, with the root.
            freed = (layer.out_channels - stored.out_channels) * 4 * ChannelAnalysis.of(layer).floats
        return LayerCost(stored, storage, head, freed, weight_bits, activation_bits)

    def marginal_bytes(self, center: Plan) -> list[list[int]]:
        """Per decision of the space, each choice's layer bytes with the layer's other decisions at
        `center`'s choices. Where a layer is both pruned and quantized, pruning saves a share of the
        quantized weight, not of the float one: priced alone (the features' bytes), pruning looked several
        times more valuable next to INT4 codes than it is, and MCTS's rollouts pruned nearly every layer
        (measured: docs/search.md#measured)."""
        out = []
        for d in self.space.decisions:
            layer = self.space.layers[d.layer]
            others = {o.name: center.get(o.name) for o in self.decisions[d.layer] if o.name != d.name}
            out.append([self.choice_cost(layer, {**others, d.name: c}).bytes for c in d.choices])
        return out

    def choice_cost(self, layer: Layer, choices: Mapping[str, Choice]) -> LayerCost:
        """One layer's cost under its `choices` {decision name: choice}, every other layer float (its
        producer keeps all channels): the price of a layer's option for strategies that price layers
        one at a time (`search/knapsack.py`)."""
        return self.layer_cost(layer, choices, self._own_kept(layer, choices))

    def kept_counts(self, plan: Plan) -> dict[str, int]:
        """{layer: output channels kept} for the plan's structured pruning, without the weights.

        The shipped compressors keep a count of channels that depends on the choice alone, so it is
        read off `RemovesChannels.kept_channels` on a weight of zeros; the evaluator passes the counts of
        the channels it really keeps.
        """
        out = {}
        for lname in self.roots:
            n = self._own_kept(self.space.layers[lname], {d.name: plan.get(d.name) for d in self.decisions[lname]})
            if n is not None:
                out[lname] = n
        return out

    def _own_kept(self, layer: Layer, choices: Mapping[str, Choice]) -> int | None:
        """Output channels `choices` keep of `layer` (None: all of them)."""
        if not ChannelAnalysis.of(layer).members:
            return None
        kept = None
        for d in self.decisions[layer.name]:
            c, comp = choices.get(d.name), self.space.compressors[d.compressor]
            if c is None or not isinstance(comp, RemovesChannels):
                continue
            key = (layer.name, comp.name, c)
            if key not in self._counts:
                idx = comp.kept_channels(torch.zeros(layer.weight_shape), c)
                self._counts[key] = None if idx is None else int(idx.numel())
            if self._counts[key] is not None:
                kept = self._counts[key]
        return kept


def _stored_layer(layer: Layer, out: int | None, inp: int | None) -> Layer:
    """`layer` with `out` output and `inp` input channels kept, its MACs scaled to match."""
    if out is None and inp is None:
        return layer
    out = layer.out_channels if out is None else out
    inp = layer.in_channels if inp is None else inp
    macs = layer.macs * out * inp // (layer.out_channels * layer.in_channels)
    return dataclasses.replace(layer, weight_shape=(out, inp, *layer.weight_shape[2:]), macs=macs)

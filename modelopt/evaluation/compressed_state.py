"""The tensors a plan swaps into the resident model, built once and cached.

`CompressedStates` applies each layer's compressor chain to its weight (cached per layer and
choices, on the workload, so runs that share it share them), slices structured pruning's removed
channels out first and scatters the result back, zeroes the removed channels' norms, re-estimates
batch-norm statistics (`modelopt.evaluation.norm_stats`), calibrates activation ranges, and charges every
one-time preparation to the first plan that needs it (`modelopt.evaluation.prep_costs`). It also builds the
module a plan deploys as (`physical_model`, `deployable`). Scoring lives in `modelopt.evaluation.scorer`,
cost accounting in `modelopt.evaluation.cost`.
"""

from __future__ import annotations

import contextlib
import copy
import time
from typing import Any

import torch
from torch import nn

from modelopt.compressors._inputs import (
    Calibration,
    InputQParams,
    fake_quantized_inputs,
    input_ranges,
    install_input_quantizers,
)
from modelopt.evaluation.norm_stats import NormStats
from modelopt.evaluation.prep_costs import OneTimeCosts
from modelopt.evaluation.routes import PlanRoutes
from modelopt.model.layer_inputs import LayerInputs, input_columns, input_hessians
from modelopt.model.layers import compressible_modules
from modelopt.model.surgery import remove_channels
from modelopt.model.workload import Workload
from modelopt.plan.plan import Plan
from modelopt.plan.space import SearchSpace

__all__ = ["CompressedStates", "Kept"]

Kept = dict[str, tuple[str, torch.Tensor]]  # {conv1 layer: (decision, ascending kept output channels)}


class CompressedStates:
    """Builds what a plan runs with on the workload's model.

    Args:
        workload: The resident model, its original weights and splits.
        space: The decisions and their compressors.
        one_time: Where one-time preparations are charged (shared with the scorer and exits).
        routes: Where samples leave the plan's forward pass (early exit), for `deployable`.

    Example:
        >>> one_time = OneTimeCosts()
        >>> states = CompressedStates(wl, space, one_time, PlanRoutes(wl, space, one_time))
        >>> state, cost = states.compressed_state(plan)
        >>> with wl.state(state), states.activation_quant(plan):
        ...     logits = wl.logits(x)                 # or, the same: states.logits(plan, x)
    """

    def __init__(self, workload: Workload, space: SearchSpace, one_time: OneTimeCosts, routes: PlanRoutes) -> None:
        self.workload, self.space, self.one_time, self.routes = workload, space, one_time, routes
        # Compressed tensors live on the workload, so runs that share it (a sweep) share them too.
        self._tensors: dict[tuple[Any, ...], torch.Tensor] = workload.tensor_cache
        # Cached tensors are keyed by each compressor's name and options, so runs that share a
        # workload with differently configured compressors never read each other's tensors.
        self._compressor_keys = {
            name: (name, repr(sorted(c.options().items()))) for name, c in space.compressors.items()
        }
        self._layer_decisions = {
            layer.name: [d for d in space.decisions if d.layer == layer.name] for layer in workload.layers
        }
        # conv2 -> conv1 of each block whose internal channels structured pruning may remove.
        self._layers = {layer.name: layer for layer in workload.layers}
        self._producer = {x.channel_consumer: x.name for x in workload.layers if x.channel_consumer is not None}
        self._kept: dict[tuple[Any, ...], torch.Tensor | None] = {}
        self._input_ranges: dict[Calibration, dict[str, tuple[float, float]]] = {}  # activation quantization
        self.norm_stats = NormStats(workload, one_time)  # batch norms re-estimated per plan
        self._pre_passes: dict[str, float] = {}  # a strategy's passes before any plan (add_pre_pass)

    # ---- weights --------------------------------------------------------------------------

    def kept_channels(self, plan: Plan) -> Kept:
        """{conv1 layer: (decision, ascending kept output channels)} for the plan's structured pruning."""
        out = {}
        for lname in self._producer.values():
            for d in self._layer_decisions[lname]:
                c = plan.get(d.name)
                if c is None:
                    continue
                key = (lname, self._compressor_keys[d.compressor], c)
                if key not in self._kept:
                    self._kept[key] = self.space.compressors[d.compressor].kept_channels(
                        self.workload.original[lname], c)
                idx = self._kept[key]
                if idx is not None:
                    out[lname] = (d.name, idx)
        return out

    def compressed_weights(self, plan: Plan) -> dict[str, torch.Tensor]:
        """The weights the plan runs with, full shape (structurally pruned channels are zero)."""
        kept = self.kept_channels(plan)
        weights = {}
        for layer in self.workload.layers:
            decs = self._layer_decisions[layer.name]
            choices = tuple(plan.get(d.name) for d in decs)
            prod = kept.get(self._producer.get(layer.name, ""))
            if all(c is None for c in choices) and prod is None:
                continue
            in_key = None if prod is None else tuple(prod[1].tolist())
            key = (layer.name, tuple(self._compressor_keys[d.compressor] for d in decs), choices, in_key)
            w = self._tensors.get(key)
            if w is None:
                self._tensors[key] = w = self._compress(layer.name, plan, kept).contiguous()
            weights[layer.name] = w
        return weights

    def _compress(self, lname: str, plan: Plan, kept: Kept) -> torch.Tensor:
        # The chain runs on the physically kept slice, so it computes exactly what the smaller
        # model holds (group boundaries, per-tensor scales, magnitude ranks), then is scattered back.
        orig = self.workload.original[lname]
        own, prod = kept.get(lname), kept.get(self._producer.get(lname, ""))
        rows = torch.arange(orig.shape[0], device=orig.device) if own is None else own[1].to(orig.device)
        cols = torch.arange(orig.shape[1], device=orig.device) if prod is None else prod[1].to(orig.device)
        w = orig if own is None and prod is None else orig[rows[:, None], cols[None, :]]
        for d in self._layer_decisions[lname]:
            c = plan.get(d.name)
            if c is None or (own is not None and d.name == own[0]):  # slicing already applied that one
                continue
            comp = self.space.compressors[d.compressor]
            if n := comp.input_images(c):
                w = comp.apply_calibrated(w, c, self.layer_inputs(lname, n, None if prod is None else cols))
            else:
                w = comp.apply(w, c)
        if own is None and prod is None:
            return w
        full = torch.zeros_like(orig)
        full[rows[:, None], cols[None, :]] = w
        return full

    def layer_inputs(self, lname: str, images: int, kept_inputs: torch.Tensor | None = None) -> LayerInputs | None:
        """Second moments of `lname`'s inputs in the float model over the first `images` calib images
        (None for a layer they are not measured on, a grouped conv); `kept_inputs`: only those input
        channels' columns (structured pruning removed the others). Measured once per image count for
        every layer (`gptq.input_hessians`), shared by runs on the workload; charged by `input_cost`.
        """
        x = self.workload.split("calib").x[:images]
        cache = self.workload.input_cache
        if x.shape[0] not in cache:
            t0 = time.perf_counter()
            with self.workload.weights(self.workload.original):
                cache[x.shape[0]] = input_hessians(self.workload.model, self.workload.modules, x,
                                                   self.workload.batch_size)
            self.one_time.timed(f"layer_inputs:{x.shape[0]}", time.perf_counter() - t0)
        inputs = cache[x.shape[0]].get(lname)
        if inputs is None or kept_inputs is None:
            return inputs
        return inputs.select(input_columns(kept_inputs, self.workload.original[lname][0, 0].numel()))

    # ---- the state a plan swaps in --------------------------------------------------------

    def compressed_state(self, plan: Plan) -> tuple[dict[str, torch.Tensor], float]:
        """Every tensor the plan changes, by state_dict name, and the budget spent preparing them.

        Weights; for structured pruning, the norm's scale and shift zeroed on removed channels
        (so the ReLU after it outputs exactly 0 there); after any pruning, every batch norm's
        statistics re-estimated on calibration images (cached by plan key). The budget includes
        calibrating activation ranges (`input_qparams`) the first time a plan needs them: that runs
        the float model, so it happens here, before the plan's tensors are swapped in.
        """
        state = {f"{name}.weight": w for name, w in self.compressed_weights(plan).items()}
        for lname, (_, idx) in self.kept_channels(plan).items():
            norm = self._layers[lname].channel_norm
            assert norm is not None
            bn = self.norm_stats.norms[norm]
            drop = torch.ones(bn.num_features, dtype=torch.bool, device=idx.device)
            drop[idx] = False
            for attr in ("weight", "bias"):
                t = getattr(bn, attr)
                if t is not None:
                    state[f"{norm}.{attr}"] = t.data.masked_fill(drop.to(t.device), 0.0)
        stats, cost = self.norm_stats.recalibrated(plan.key, self._norm_images(plan), state)
        pre = sum(self.one_time.charge(k, c) for k, c in self._pre_passes.items())
        return {**state, **stats}, cost + self.input_qparams(plan)[1] + self.input_cost(plan) + pre

    def activation_quant(self, plan: Plan) -> contextlib.AbstractContextManager[None]:
        """Within the block, the plan's activation-quantized layers see their inputs quantize-dequantized.

        Ranges are static (as a deployed integer model has them): calibrated on the float model,
        once per `Calibration` (`input_qparams`), and shared by every plan. Enter it inside
        `workload.state(...)` of `compressed_state(plan)`'s tensors, which calibrated them first.
        """
        qparams, _ = self.input_qparams(plan)
        return fake_quantized_inputs(self.workload.modules, qparams) if qparams else contextlib.nullcontext()

    def logits(self, plan: Plan, x: torch.Tensor) -> torch.Tensor:
        """The plan's logits on `x` as scored (compressed weights, quantized activations; no exits):
        what an exported model must reproduce."""
        state, _ = self.compressed_state(plan)
        with torch.inference_mode(), self.workload.state(state), self.activation_quant(plan):
            return self.workload.logits(x)

    def input_qparams(self, plan: Plan) -> tuple[dict[str, InputQParams], float]:
        """Per activation-quantized layer of the plan, its input's quantization; and the budget
        calibrating cost now: images / len(val) the first time a `Calibration` is needed, else 0.

        One pass of the float model over the calib split's first `Calibration.images` images
        measures every layer's input range; call it while the float model is resident.
        """
        bits = self._input_bits(plan)
        cost = 0.0
        for calib in {c for _, c in bits.values()}:
            x = self.workload.split("calib").x[: calib.images]
            if calib not in self._input_ranges:
                self._input_ranges[calib] = input_ranges(self.workload.model, self.workload.modules, x, calib,
                                                         self.workload.batch_size)
            cost += self.one_time.charge(f"input_ranges:{calib}", x.shape[0] / len(self.workload.split("val")))
        return {n: InputQParams.from_range(*self._input_ranges[c][n], b) for n, (b, c) in bits.items()}, cost

    def _input_bits(self, plan: Plan) -> dict[str, tuple[int, Calibration]]:
        """{layer: (input bits, how its range is measured)} for the plan's activation-quantized layers."""
        bits: dict[str, tuple[int, Calibration]] = {}
        for layer in self.workload.layers:
            for d in self._layer_decisions[layer.name]:
                comp = self.space.compressors[d.compressor]
                b = comp.activation_bits(plan.get(d.name))
                if b < 32 and (layer.name not in bits or b < bits[layer.name][0]):
                    # A compressor offering activation bits says how to calibrate in `calibration`.
                    bits[layer.name] = (b, getattr(comp, "calibration", Calibration()))
        return bits

    def _norm_images(self, plan: Plan) -> int:
        """Calibration images the plan's batch-norm statistics are re-estimated on (0: none)."""
        n = max((self.space.compressors[d.compressor].norm_calibration(plan.get(d.name))
                 for d in self.space.decisions), default=0)
        return min(n, len(self.workload.split("calib"))) if self.norm_stats.norms else 0

    # ---- one-time preparations ------------------------------------------------------------

    def _input_images(self, plan: Plan) -> set[int]:
        """Calibration image counts whose layer inputs the plan's choices need (GPTQ)."""
        calib = len(self.workload.split("calib"))
        return {min(n, calib) for d in self.space.decisions
                if (n := self.space.compressors[d.compressor].input_images(plan.get(d.name)))}

    def input_cost(self, plan: Plan) -> float:
        """Budget the plan's calibrated choices cost now: the float pass measuring layer inputs, charged
        to the first plan of the run that needs it (images / len(val)), then 0."""
        val = len(self.workload.split("val"))
        return sum(self.one_time.charge(f"layer_inputs:{n}", n / val) for n in self._input_images(plan))

    def add_pre_pass(self, key: str, cost: float) -> None:
        """Records work done for the search before any plan (e.g. a gradient pass pricing every
        choice), charged once with the first plan scored after it (and paid on resume)."""
        self._pre_passes[key] = cost

    @property
    def pre_passes(self) -> dict[str, float]:
        """Work done for the search before any plan, by key (`add_pre_pass`), charged with the first plan."""
        return dict(self._pre_passes)

    def mark_paid(self, plan: Plan) -> None:
        """Records the one-time preparations `plan` needed as paid (a resumed run, for the trials
        its journal holds): what the killed process charged is not charged again."""
        keys = {f"input_ranges:{c}" for _, c in self._input_bits(plan).values()}
        keys |= {f"layer_inputs:{n}" for n in self._input_images(plan)} | set(self._pre_passes)
        if n := self._norm_images(plan):
            keys.add(f"norm_reference:{n}")
        self.one_time.mark_paid(keys | self.routes.one_time_keys(plan))

    # ---- the deployable module ------------------------------------------------------------

    def physical_model(self, plan: Plan) -> nn.Module:
        """A copy of the model holding the plan's weights, with structurally pruned channels
        physically removed (smaller Conv2d/BatchNorm2d): same outputs as the evaluated model."""
        state, _ = self.compressed_state(plan)
        with self.workload.state(state):
            model = copy.deepcopy(self.workload.model)
        return remove_channels(model, {lname: idx for lname, (_, idx) in self.kept_channels(plan).items()})

    def deployable(self, plan: Plan) -> nn.Module:
        """The module the plan deploys as: `physical_model`, its quantized inputs quantized as scored (the
        hooks `modelopt.load` puts back), routed as the plan routes (an early-exit network that really returns
        at the first confident exit): what the torch engine runs and times."""
        model = self.physical_model(plan)
        qparams, _ = self.input_qparams(plan)
        if qparams:
            install_input_quantizers(compressible_modules(model), qparams)
        return self.routes.deployable(model, plan)

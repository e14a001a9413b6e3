"""The evaluator: applies a plan to the resident model and scores it on a split."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
import time
from typing import Any

import torch
from torch import nn

from modelopt.compressors._base import Storage
from modelopt.compressors.activations import (
    Calibration,
    InputQParams,
    fake_quantized_inputs,
    input_ranges,
)
from modelopt.compressors.gptq import LayerInputs, input_columns, input_hessians
from modelopt.early_exit.heads import ExitHead
from modelopt.early_exit.plan_exits import PlanExits
from modelopt.early_exit.runtime import ExitLayout
from modelopt.early_exit.simulate import ExitPolicy
from modelopt.errors import TrialError
from modelopt.confidence import PairedCounts
from modelopt.fidelity import Fidelity, best_case, max_correct
from modelopt.layers import Layer
from modelopt.metrics import Metrics
from modelopt.norm_stats import NormStats
from modelopt.plan import Plan
from modelopt.prep_costs import OneTimeCosts
from modelopt.space import SearchSpace
from modelopt.workload import Workload


class Evaluator:
    """Scores plans: cached compressed tensors per (layer, choices), results cached by plan key.

    Example:
        >>> ev = Evaluator(workload, space)
        >>> ev.evaluate(space.uniform("quantize", QuantSpec(8)), split="val").retention
    """

    def __init__(self, workload: Workload, space: SearchSpace, *, exit_images: torch.Tensor | None = None) -> None:
        """`exit_images`: normalised images (never val or test) that early-exit heads are fitted on
        besides the calib split; their feature pass is charged with the fit."""
        self.workload = workload
        self.space = space
        # Compressed tensors live on the workload, so runs that share it (a sweep) share them too.
        self._tensors: dict[tuple[Any, ...], torch.Tensor] = workload.tensor_cache
        self._results: dict[tuple[str, str, int], Metrics] = {}
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
        self.one_time = OneTimeCosts()  # reference passes, fits, calibrations: charged once per run
        self.norm_stats = NormStats(workload, self.one_time)  # batch norms re-estimated per plan
        self._pre_passes: dict[str, float] = {}  # a strategy's passes before any plan (add_pre_pass)
        self.exits = PlanExits(workload, space, exit_images, self.one_time)  # early exit's heads, priors, reach

    # ---- static accounting ----------------------------------------------------------------

    def kept_channels(self, plan: Plan) -> dict[str, tuple[str, torch.Tensor]]:
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

    def _shape(self, plan: Plan, kept: dict[str, tuple[str, torch.Tensor]] | None = None
               ) -> dict[str, tuple[int, int]]:
        """{layer: (kept output channels, kept input channels)} where structured pruning shrinks it."""
        kept = self.kept_channels(plan) if kept is None else kept
        out = {}
        for layer in self.workload.layers:
            own, prod = kept.get(layer.name), kept.get(self._producer.get(layer.name, ""))
            if own is not None or prod is not None:
                out[layer.name] = (layer.out_channels if own is None else int(own[1].numel()),
                                   layer.in_channels if prod is None else int(prod[1].numel()))
        return out

    def stored_layer(self, plan: Plan, layer: Layer) -> Layer:
        """`layer` as the plan stores and runs it: structured pruning's kept channels, MACs scaled."""
        shape = self._shape(plan).get(layer.name)
        if shape is None:
            return layer
        out, inp = shape
        macs = layer.macs * out * inp // (layer.out_channels * layer.in_channels)
        return dataclasses.replace(layer, weight_shape=(out, inp, *layer.weight_shape[2:]), macs=macs)

    def storage(self, plan: Plan, layer: Layer) -> Storage:
        """How the plan stores `layer`'s weight: its compressors' chain, in order (prune, then quantize)."""
        stored = self.stored_layer(plan, layer)
        st = Storage(stored.weight_shape)
        for d in self._layer_decisions[layer.name]:
            st = self.space.compressors[d.compressor].stored(stored, plan.get(d.name), st)
        return st

    def size_bytes(self, plan: Plan) -> int:
        total = self.workload.other_bytes
        for lname, (out, _) in self._shape(plan).items():
            layer = self._layers[lname]
            if layer.channel_consumer is not None:
                # Removed channels take their folded norm (scale, shift) and conv1's bias with them.
                total -= (layer.out_channels - out) * 4 * (2 + int(layer.has_bias))
        policy = self.exits.policy(plan)
        if policy is not None:
            total += self.exits.layout().head_bytes(policy)  # type: ignore[union-attr]
        return total + sum(self.storage(plan, layer).bytes for layer in self.workload.layers)

    def macs(self, plan: Plan) -> int:
        """Multiply-accumulates per sample under the plan (structured pruning lowers them)."""
        return sum(self.stored_layer(plan, layer).macs for layer in self.workload.layers)

    def weight_bits(self, plan: Plan, layer: str) -> int:
        bits = 32
        for d in self._layer_decisions[layer]:
            bits = min(bits, self.space.compressors[d.compressor].weight_bits(plan.get(d.name)))
        return bits

    def activation_bits(self, plan: Plan, layer: str) -> int:
        """Bits of the layer's input activations under the plan (32: float)."""
        bits = 32
        for d in self._layer_decisions[layer]:
            bits = min(bits, self.space.compressors[d.compressor].activation_bits(plan.get(d.name)))
        return bits

    def bitops(self, plan: Plan, reach: dict[str, float] | None = None) -> int:
        """Bit operations per sample; `reach`: the share of samples that run each layer (early exit)."""
        return round(sum(self.stored_layer(plan, layer).macs * self.weight_bits(plan, layer.name)
                         * self.activation_bits(plan, layer.name)
                         * (1.0 if reach is None else reach[layer.name]) for layer in self.workload.layers))

    def float_bitops(self) -> int:
        return self.workload.macs * 32 * 32

    def measure_errors(self) -> None:
        """Replaces the space's estimated per-choice errors by measured ones: each choice's relative
        error on the layer's output, |(Q - W) X|^2 / |W X|^2 over calib inputs X, when the space has
        calibrated choices (their inputs are measured anyway); else the weight's, |Q - W|^2 / |W|^2."""
        t0 = time.perf_counter()
        images = max((n for d in self.space.decisions for c in d.choices
                      if (n := self.space.compressors[d.compressor].input_images(c))), default=0)
        for d in self.space.decisions:
            w = self.workload.original[d.layer].float()  # type: ignore[index]
            inputs = self.layer_inputs(d.layer, images) if images else None  # type: ignore[arg-type]
            h = None if inputs is None else inputs.hessian.to(w.device, torch.float32)

            def energy(e: torch.Tensor, h: torch.Tensor | None = h) -> float:
                e = e.reshape(e.shape[0], -1)
                return float((e**2).sum()) if h is None else float(((e @ h) * e).sum())

            norm = energy(w) or 1.0
            feats = []
            for c, f in zip(d.choices, self.space.features[d.name]):
                if c is None:
                    feats.append(dataclasses.replace(f, error=0.0))
                    continue
                plan = self.space.plan({d.name: c})
                try:
                    q = self.compressed_weights(plan)[d.layer].float()  # type: ignore[index]
                except Exception:  # noqa: BLE001 - a choice that crashes is a broken choice; trials record why
                    feats.append(dataclasses.replace(f, error=1.0))
                    continue
                err = energy(q - w) / norm
                # A choice that breaks the weight (non-finite) is as bad as losing it entirely.
                feats.append(dataclasses.replace(f, error=err if math.isfinite(err) else 1.0))
            self.space.features[d.name] = tuple(feats)
        # Every choice's tensors (clipping search, GPTQ) are computed here, once; the layer-input
        # pass inside is timed apart and charged with the first plan that needs it.
        self.one_time.timed("choice_tensors", time.perf_counter() - t0 - sum(
            s for k, s in self.one_time.seconds.items() if k.startswith("layer_inputs:")))
        if self.exits.decisions:
            self.exits.priors()

    # ---- early exit (modelopt.early_exit.plan_exits) ---------------------------------------

    def exit_layout(self) -> ExitLayout | None:
        """Where the space's candidate exits sit (None when no early_exit decision is offered)."""
        return self.exits.layout()

    def exit_policy(self, plan: Plan) -> ExitPolicy | None:
        """The plan's active exits and thresholds; None when it has none."""
        return self.exits.policy(plan)

    def exit_heads(self) -> tuple[dict[str, ExitHead], float]:
        """The fitted head of every candidate exit, and the budget fitting them cost now (0 once fitted)."""
        return self.exits.heads()

    # ---- evaluation -----------------------------------------------------------------------

    def cost(self, split: str = "val", n: int | None = None) -> float:
        """Budget charged for scoring one plan on n samples of a split: n / len(val)."""
        total = len(self.workload.split("val"))
        return min(n or total, len(self.workload.split(split))) / total

    def trial_cost(self, metrics: Metrics) -> float:
        """Budget a scored plan costs: the samples scored plus its preparation (`Metrics.prep_cost`)."""
        return self.cost(metrics.split, metrics.n_samples) + metrics.prep_cost

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

    def _compress(self, lname: str, plan: Plan, kept: dict[str, tuple[str, torch.Tensor]]) -> torch.Tensor:
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

    def _input_images(self, plan: Plan) -> set[int]:
        """Calibration image counts whose layer inputs the plan's choices need (GPTQ)."""
        calib = len(self.workload.split("calib"))
        return {min(n, calib) for d in self.space.decisions if d.layer is not None
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

        Example:
            >>> state, _ = ev.compressed_state(plan)
            >>> with ev.workload.state(state), ev.activation_quant(plan):
            ...     logits = ev.workload.logits(x)
        """
        qparams, _ = self.input_qparams(plan)
        return fake_quantized_inputs(self.workload.modules, qparams) if qparams else contextlib.nullcontext()

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
                 for d in self.space.decisions if d.layer is not None), default=0)
        return min(n, len(self.workload.split("calib"))) if self.norm_stats.norms else 0

    def mark_paid(self, plan: Plan) -> None:
        """Records the one-time preparations `plan` needed as paid (a resumed run, for the trials
        its journal holds): what the killed process charged is not charged again."""
        keys = {f"input_ranges:{c}" for _, c in self._input_bits(plan).values()}
        keys |= {f"layer_inputs:{n}" for n in self._input_images(plan)} | set(self._pre_passes)
        if n := self._norm_images(plan):
            keys.add(f"norm_reference:{n}")
        self.one_time.mark_paid(keys | self.exits.one_time_keys(plan))

    def physical_model(self, plan: Plan) -> nn.Module:
        """A copy of the model holding the plan's weights, with structurally pruned channels
        physically removed (smaller Conv2d/BatchNorm2d): same outputs as the evaluated model.

        Example:
            >>> small = ev.physical_model(plan)
            >>> modelopt.latency.torch_latency(small, x, batch_size=64)
        """
        state, _ = self.compressed_state(plan)
        with self.workload.state(state):
            model = copy.deepcopy(self.workload.model)
        from modelopt.compressors.prune import remove_channels

        return remove_channels(model, {lname: idx for lname, (_, idx) in self.kept_channels(plan).items()})

    def deployable(self, plan: Plan) -> nn.Module:
        """The module the plan deploys as: `physical_model`, wrapped in an `EarlyExitNet` that really
        returns at the first confident exit when the plan has exits (what latency is measured on)."""
        model = self.physical_model(plan)
        policy = self.exit_policy(plan)
        if policy is None:
            return model
        from modelopt.early_exit import EarlyExitNet, split_backbone

        heads, _ = self.exit_heads()
        size = tuple(self.workload.split("val").x.shape[2:])
        return EarlyExitNet(split_backbone(model, size), heads, policy).eval()  # type: ignore[arg-type]

    def evaluate(self, plan: Plan, split: str = "val", n: int | None = None) -> Metrics:
        """Scores `plan` on the first `n` samples of `split` (all when None).

        Raises:
            TrialError: when the compressed model yields non-finite outputs.
        """
        data = self.workload.split(split)
        n = len(data) if n is None else max(1, min(n, len(data)))
        key = (plan.key, split, n)
        if key in self._results:
            return self._results[key]
        t0 = time.perf_counter()
        policy, state, prep = self._prepare(plan)
        with self.workload.state(state), self.activation_quant(plan):
            pred, exit_at = self._predict(plan, data.x[:n], policy)
        metrics = self._metrics(plan, split, pred, time.perf_counter() - t0, prep_cost=prep, policy=policy,
                                exit_at=exit_at)
        self._results[key] = metrics
        return metrics

    def evaluate_staged(self, plan: Plan, min_retention: float, fidelity: Fidelity, *, finish: bool = True,
                        confidence: float = 0.0, count_gains: bool = True) -> Metrics:
        """Scores `plan` on the val split in stages, stopping once the rest cannot matter.

        After each stage of `fidelity`, the plan stops if an upper confidence bound on its
        retention over the whole split is below `min_retention` (see `modelopt.fidelity`), or,
        with `confidence` > 0, if even the best case for the rest of the split (no further
        loss, gains at their optimistic rate) leaves its lower retention bound at `confidence`
        under the floor: it could not be certified feasible (`modelopt.fidelity.best_case`).
        With `finish=False` (the plan cannot beat the best one found, whatever its accuracy)
        it stops after the first stage: its retention there only informs the search.
        """
        data = self.workload.split("val")
        full = (plan.key, "val", len(data))
        if full in self._results:
            return self._results[full]
        t0 = time.perf_counter()
        cuts = fidelity.cuts(len(data))
        base_right = data.base_correct
        preds: list[tuple[torch.Tensor, torch.Tensor | None]] = []
        policy, state, prep = self._prepare(plan)
        with self.workload.state(state), self.activation_quant(plan):
            start = 0
            for stop in cuts:
                preds.append(self._predict(plan, data.x[start:stop], policy))
                start = stop
                if stop == len(data):
                    break
                pred, exit_at = _joined(preds)
                if not finish:
                    return self._metrics(plan, "val", pred, time.perf_counter() - t0, stopped="dominated",
                                         prep_cost=prep, policy=policy, exit_at=exit_at)
                right = pred == data.y[:stop]
                br, bw = base_right[:stop], ~base_right[:stop]
                bound = max_correct(
                    plan_correct=int(right.sum()),
                    base_right=int(br.sum()), lost=int((br & ~right).sum()),
                    base_wrong=int(bw.sum()), gained=int((bw & right).sum()),
                    base_right_rest=int(base_right[stop:].sum()), base_wrong_rest=int((~base_right[stop:]).sum()),
                    delta=fidelity.delta,
                )
                stage = PairedCounts(stop, int(br.sum()), int((br & ~right).sum()),
                                     int((bw & right).sum()) if count_gains else 0)
                hopeless = confidence > 0 and best_case(
                    stage, int(base_right[stop:].sum()), int((~base_right[stop:]).sum()), fidelity.delta
                ).retention_lower(confidence) < min_retention
                if hopeless or bound < min_retention * int(base_right.sum()):
                    return self._metrics(plan, "val", pred, time.perf_counter() - t0, stopped="infeasible",
                                         prep_cost=prep, policy=policy, exit_at=exit_at)
        pred, exit_at = _joined(preds)
        metrics = self._metrics(plan, "val", pred, time.perf_counter() - t0, prep_cost=prep, policy=policy,
                                exit_at=exit_at)
        self._results[full] = metrics
        return metrics

    def _prepare(self, plan: Plan) -> tuple[ExitPolicy | None, dict[str, torch.Tensor], float]:
        """The plan's exit policy, the tensors it swaps in, and the budget its preparation cost
        (exit heads are fitted on the float model, so before the swap)."""
        policy, prep = self.exits.setup(plan)
        state, cost = self.compressed_state(plan)
        return policy, state, prep + cost

    def _predict(self, plan: Plan, x: torch.Tensor, policy: ExitPolicy | None
                 ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Predictions for `x` and, with exits, the position in `policy.exits` each sample left at."""
        if policy is not None:
            return self.exits.predict(plan, x, policy)
        logits = self.workload.logits(x)
        if not torch.isfinite(logits).all():
            raise TrialError(f"plan {plan.key} gives non-finite outputs")
        return logits.argmax(dim=1), None

    def _metrics(self, plan: Plan, split: str, pred: torch.Tensor, seconds: float, stopped: str | None = None,
                 prep_cost: float = 0.0, policy: ExitPolicy | None = None, exit_at: torch.Tensor | None = None
                 ) -> Metrics:
        """Metrics of predictions `pred` for the first len(pred) samples of `split` (`exit_at`: where
        each left, with exits: MACs and bitops are then means over the samples)."""
        data = self.workload.split(split)
        n = int(pred.shape[0])
        y, base = data.y[:n], data.base_pred[:n]
        right, base_right = pred == y, base == y
        acc = float(right.float().mean())
        base_acc = float(base_right.float().mean())
        size = self.size_bytes(plan)
        reach, head_macs, exited = None, 0.0, None
        if policy is not None and exit_at is not None:
            reach, head_macs = self.exits.reach(policy, exit_at), self.exits.head_macs(policy, exit_at)
            exited = float((exit_at < len(policy.exits)).float().mean())
        macs = round(sum(self.stored_layer(plan, x).macs * (1.0 if reach is None else reach[x.name])
                         for x in self.workload.layers) + head_macs)
        return Metrics(
            split=split,
            n_samples=n,
            accuracy=acc,
            baseline_accuracy=base_acc,
            retention=acc / base_acc if base_acc > 0 else math.nan,
            agreement=float((pred == base).float().mean()),
            size_bytes=size,
            float_size_bytes=self.workload.float_size_bytes,
            compression=self.workload.float_size_bytes / size,
            bitops=self.bitops(plan, reach) + round(head_macs * 32 * 32),
            macs=macs,
            eval_seconds=seconds,
            float_bitops=self.float_bitops(),
            float_macs=self.workload.macs,
            stopped=stopped,
            prep_cost=prep_cost,
            exited=exited,
            base_right=int(base_right.sum()),
            lost=int((base_right & ~right).sum()),
            gained=int((right & ~base_right).sum()),
        )


def _joined(parts: list[tuple[torch.Tensor, torch.Tensor | None]]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Predictions (and exits, when any) of consecutive stages, concatenated."""
    pred = torch.cat([p for p, _ in parts])
    exits = [e for _, e in parts]
    return pred, None if any(e is None for e in exits) else torch.cat(exits)  # type: ignore[misc]

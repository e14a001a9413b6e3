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
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from modelopt.compressors.contract import (
    Calibration,
    InputQParams,
    RemovesChannels,
    fake_quantized_inputs,
    input_ranges,
    install_input_quantizers,
)
from modelopt.data.split import Split
from modelopt.evaluation.fitted import Fitted
from modelopt.evaluation.norm_stats import NormStats
from modelopt.evaluation.prep_costs import OneTimeCosts
from modelopt.evaluation.routes import PlanRoutes
from modelopt.model.branches import Branch, BranchAnalysis, skipped_block
from modelopt.model.channels import ChannelAnalysis, Removal, zeroed
from modelopt.model.layer_inputs import LayerInputs, input_columns, input_hessians
from modelopt.model.layers import compressible_modules
from modelopt.model.skip_repair import branch_means, skip_state
from modelopt.model.workload import Workload
from modelopt.plan.plan import Plan
from modelopt.plan.space import SearchSpace
from modelopt.solvers.least_squares import refit_reader

__all__ = ["CompressedStates", "Kept", "Slices"]

Kept = dict[str, tuple[str, torch.Tensor]]  # {root layer: (decision, ascending kept output channels)}
Slices = dict[str, tuple[torch.Tensor | None, torch.Tensor | None]]  # {layer: (kept rows, kept columns)}

# Calibration images a removed branch's mean and the next block's refit are measured on (`skip_repair`; more buy
# little: docs/compressors.md, depth).
SKIP_IMAGES = 512


def _kept(n: int, removed: set[int]) -> torch.Tensor | None:
    """The ascending indices of `n` that `removed` leaves (None: all of them)."""
    return None if not removed else torch.tensor(sorted(set(range(n)) - removed), dtype=torch.long)


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
        # The roots of the channel groups structured pruning may remove from (`modelopt.model.channels`).
        self._layers = dict(space.layers)
        self._roots = [x.name for x in space.layers.values() if ChannelAnalysis.of(x).members]
        self._kept: dict[tuple[Any, ...], torch.Tensor | None] = {}
        # Modules whose removed channels are zeroed by name (norms, biases), besides the compressed weights.
        self._zeroable = {n for n, m in workload.model.named_modules() if list(m.parameters(recurse=False))}
        self._removals: dict[tuple[str, tuple[int, ...]], tuple[Removal, ...]] = {}
        # (calibration, removed blocks) -> every layer's input range (activation quantization)
        self._input_ranges: dict[tuple[Calibration, str], dict[str, tuple[float, float]]] = {}
        self.norm_stats = NormStats(workload, one_time)  # batch norms re-estimated per plan
        self._pre_passes: dict[str, float] = {}  # a strategy's passes before any plan (add_pre_pass)
        self._fitted: dict[str, Fitted] = {}  # plan key -> its reconstructed weights (`adopt`)
        self._skips: dict[tuple[str, ...], dict[str, torch.Tensor]] = {}  # removed blocks -> their float state
        self._means: dict[str, torch.Tensor] | None = None  # every removable branch's mean (`branch_means`)
        self._skipped: dict[str, tuple[Branch, ...]] = {}  # plan key -> the branches it removes
        # `layer_keys` -> what `exporters._forms.layer_steps` built for it: the stored forms along the layer's chain
        # (GPTQ's codes again, for every reconstruction's targets and every export, without this).
        self.forms: dict[tuple[Any, ...], tuple[Any, ...]] = {}
        self._keys: dict[str, dict[str, tuple[Any, ...]]] = {}  # plan key -> `layer_keys`

    # ---- removed branches (depth) ---------------------------------------------------------

    def skipped(self, plan: Plan) -> tuple[Branch, ...]:
        """The residual branches the plan removes (`SearchSpace.removed_branches`), in model order (kept per plan:
        every layer's weights ask)."""
        if plan.key not in self._skipped:
            self._skipped[plan.key] = tuple(self.workload.analyses.get(BranchAnalysis).branches[end]
                                            for end in self.space.removed_branches(plan))
        return self._skipped[plan.key]

    def skipped_layers(self, plan: Plan) -> frozenset[str]:
        """The compressible layers on the branches the plan removes: no engine runs them."""
        return frozenset(name for b in self.skipped(plan) for name in b.layers)

    def _skip_key(self, plan: Plan) -> str:
        """The removed blocks as one-time preparations name them ("" for none)."""
        return ",".join(b.block for b in self.skipped(plan))

    def skip_state(self, plan: Plan) -> dict[str, torch.Tensor]:
        """The float tensors of the model with the plan's branches removed and repaired (`skip_repair.skip_state`;
        cached per set of removed blocks, charged once each as three passes over its images)."""
        skips = self.skipped(plan)
        if not skips:
            return {}
        key = tuple(b.block for b in skips)
        if key not in self._skips:
            if self._means is None:
                branches = self.workload.analyses.get(BranchAnalysis).branches
                self._means = branch_means(self.workload, tuple(branches.values()), SKIP_IMAGES)
            self._skips[key] = skip_state(self.workload, skips, SKIP_IMAGES, self._means)
        return self._skips[key]

    def _skip_cost(self, plan: Plan) -> float:
        skips = self.skipped(plan)
        if not skips:
            return 0.0
        images = min(SKIP_IMAGES, len(self.workload.split(Split.CALIB)))
        return self.one_time.charge(f"skip:{self._skip_key(plan)}", 3 * images / len(self.workload.split(Split.VAL)))

    def float_weight(self, lname: str, plan: Plan) -> torch.Tensor:
        """`lname`'s weight before compression under `plan`: the float one, or the refit that stands in for a
        removed branch before it (`skip_state`)."""
        own = self.skip_state(plan).get(f"{lname}.weight")
        return self.workload.original[lname] if own is None else own

    # ---- weights --------------------------------------------------------------------------

    def kept_channels(self, plan: Plan) -> Kept:
        """{root layer: (decision, ascending kept output channels)} for the plan's structured pruning."""
        out = {}
        for lname in self._roots:
            for d in self._layer_decisions[lname]:
                c = plan.get(d.name)
                if c is None:
                    continue
                key = (lname, self._compressor_keys[d.compressor], c)
                if key not in self._kept:
                    self._kept[key] = self._select(lname, d.compressor, c)
                idx = self._kept[key]
                if idx is not None:
                    out[lname] = (d.name, idx)
        return out

    def _select(self, root: str, compressor: str, choice: Any) -> torch.Tensor | None:
        """The output channels of `root` a structured choice keeps (`RemovesChannels.kept_channels`), told the
        group's one plain reader when the choice asks for layer inputs (its readers are then refitted)."""
        comp = self.space.compressors[compressor]
        if not isinstance(comp, RemovesChannels):
            return None
        reader = self._reader(root, comp.calibration(choice).layer_inputs)
        return comp.kept_channels(self.workload.original[root], choice, reader)

    def _reader(self, root: str, images: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(weight, input second moments) of the one layer reading `root`'s group, when it has exactly one, not
        grouped, and `root` is the group's only writer; None otherwise or without images."""
        group = ChannelAnalysis.of(self._layers[root]).members
        readers = [m for m, out in group if not out]
        writers = [m for m, out in group if out]
        if not images or len(readers) != 1 or writers != [root] or readers[0] not in self._layers:
            return None
        inputs = self.layer_inputs(readers[0], images)
        if inputs is None or inputs.groups > 1:
            return None
        return self.workload.original[readers[0]], inputs.hessian

    def removals(self, plan: Plan) -> tuple[Removal, ...]:
        """What the plan's structured pruning removes, module by module (each root's group, its channels mapped
        onto every member: `ChannelGroups.removals`)."""
        out: list[Removal] = []
        for root, (_, idx) in self.kept_channels(plan).items():
            removed = tuple(sorted(set(range(self._layers[root].out_channels)) - set(idx.tolist())))
            key = (root, removed)
            if key not in self._removals:
                groups = self.workload.analyses.get(ChannelAnalysis).groups
                assert groups is not None, "a prunable layer comes from the workload's groups"
                self._removals[key] = groups.removals(root, removed)
            out += self._removals[key]
        return tuple(out)

    def kept_slices(self, plan: Plan) -> Slices:
        """Per layer the plan's structured pruning shrinks: (kept rows, kept columns) of its weight, ascending
        (None: all of them)."""
        gone: dict[str, tuple[set[int], set[int]]] = {}
        for r in self.removals(plan):
            module = self.workload.modules.get(r.module)
            if module is None:
                continue  # a norm: zeroed in `compressed_state`
            along_rows = r.out or (isinstance(module, nn.Conv2d) and module.groups > 1)
            gone.setdefault(r.module, (set(), set()))[0 if along_rows else 1].update(r.idxs)
        out: Slices = {}
        for name, (rows, cols) in gone.items():
            shape = self.workload.original[name].shape
            out[name] = (_kept(shape[0], rows), _kept(shape[1], cols))
        return out

    def adopt(self, fitted: Fitted) -> None:
        """From now on the plan `fitted.plan_key` runs with the reconstructed weights (`modelopt.reconstruct`).
        Call it through `Evaluator.adopt`, which also forgets the plan's cached scores."""
        self._fitted[fitted.plan_key] = replace(fitted, weights={
            n: w.to(self.workload.original[n].device, self.workload.original[n].dtype)
            for n, w in fitted.weights.items()})

    def drop(self, plan_key: str) -> None:
        """The plan runs as composed again (`Evaluator.drop`)."""
        self._fitted.pop(plan_key, None)

    def fitted(self, plan: Plan) -> Fitted | None:
        """The plan's reconstructed weights, when it was reconstructed (`adopt`)."""
        return self._fitted.get(plan.key)

    def compressed_weights(self, plan: Plan) -> dict[str, torch.Tensor]:
        """The weights the plan runs with, full shape (structurally pruned channels are zero); a reconstructed
        plan's own (`adopt`) where it has them."""
        fitted = self._fitted.get(plan.key)
        weights = self._layer_weights(plan)
        return weights if fitted is None else {**weights, **fitted.weights}

    def layer_keys(self, plan: Plan) -> dict[str, tuple[Any, ...]]:
        """Per layer the plan changes, everything its compressed weight depends on (its choices and their
        compressors' options, the kept slice, the refit that repairs it): the key it is cached under, and its
        stored form (`exporters._forms.layer_steps`). Layers left float and whole are absent. Kept per plan: every
        layer's stored form asks for the plan's keys."""
        if (known := self._keys.get(plan.key)) is not None:
            return known
        slices = self.kept_slices(plan)
        absorbed, skips = self.skip_state(plan), tuple(b.block for b in self.skipped(plan))
        keys = {}
        for layer in self.workload.layers:
            decs = self._layer_decisions[layer.name]
            choices = tuple(plan.get(d.name) for d in decs)
            rows, cols = slices.get(layer.name, (None, None))
            if all(c is None for c in choices) and rows is None and cols is None:
                continue
            shape_key = tuple(None if t is None else tuple(t.tolist()) for t in (rows, cols))
            repair = self._repair_images(plan) if cols is not None else 0  # the readers' refit, or none
            # A layer refitted for a removed branch before it starts from that refit.
            absorbs = skips if f"{layer.name}.weight" in absorbed else ()
            keys[layer.name] = (layer.name, tuple(self._compressor_keys[d.compressor] for d in decs), choices,
                                shape_key, repair, *absorbs)
        self._keys[plan.key] = keys
        return keys

    def _layer_weights(self, plan: Plan) -> dict[str, torch.Tensor]:
        """The weights the plan's choices give each layer, compressed one layer at a time (cached)."""
        kept, slices = self.kept_channels(plan), self.kept_slices(plan)
        weights = {}
        for name, key in self.layer_keys(plan).items():
            w = self._tensors.get(key)
            if w is None:
                self._tensors[key] = w = self._compress(name, plan, kept, slices.get(name, (None, None))).contiguous()
            weights[name] = w
        return weights

    def _compress(self, lname: str, plan: Plan, kept: Kept,
                  kept_slice: tuple[torch.Tensor | None, torch.Tensor | None]) -> torch.Tensor:
        # The chain runs on the physically kept slice, so it computes exactly what the smaller
        # model holds (group boundaries, per-tensor scales, magnitude ranks), then is scattered back.
        orig = self.workload.original[lname]
        own = kept.get(lname)
        keep_rows, keep_cols = kept_slice
        rows = torch.arange(orig.shape[0], device=orig.device) if keep_rows is None else keep_rows.to(orig.device)
        cols = torch.arange(orig.shape[1], device=orig.device) if keep_cols is None else keep_cols.to(orig.device)
        sliced = keep_rows is not None or keep_cols is not None
        w = self.sliced(lname, plan) if sliced else self.float_weight(lname, plan)
        for d in self._layer_decisions[lname]:
            c = plan.get(d.name)
            if c is None or (own is not None and d.name == own[0]):  # slicing already applied that one
                continue
            comp = self.space.compressors[d.compressor]
            if n := comp.calibration(c).layer_inputs:
                w = comp.apply_calibrated(w, c, self.layer_inputs(lname, n, kept_slice))
            else:
                w = comp.apply(w, c)
        if not sliced:
            return w
        full = torch.zeros_like(orig)
        full[rows[:, None], cols[None, :]] = w
        return full

    def _repair_images(self, plan: Plan) -> int:
        """Calibration images the readers of the plan's removed channels are refitted on: what its structured
        choices ask for (`CalibrationNeed.layer_inputs`; 0: none, no repair)."""
        compressors = self.space.compressors
        return max((compressors[self.space.decision(name).compressor].calibration(plan.get(name)).layer_inputs
                    for name, _ in self.kept_channels(plan).values()), default=0)

    def sliced(self, lname: str, plan: Plan) -> torch.Tensor:
        """`lname`'s float weight at the shape the plan stores: its kept rows and columns, refitted on the kept
        columns when the plan removed some of its inputs and repairs (`reconstruct.refit_reader`; a grouped conv,
        whose groups read their own channels, is only sliced); a layer standing in for a removed branch before it,
        its refit (`float_weight`). Every compressor's chain starts here."""
        orig = self.float_weight(lname, plan)
        keep_rows, keep_cols = self.kept_slices(plan).get(lname, (None, None))
        w = orig if keep_rows is None else orig[keep_rows.to(orig.device)]
        if keep_cols is None:
            return w
        cols = keep_cols.to(orig.device)
        inputs = self.layer_inputs(lname, images) if (images := self._repair_images(plan)) else None
        if inputs is None or inputs.groups > 1:
            return w[:, cols]
        return refit_reader(w, inputs.hessian, input_columns(cols, orig[0, 0].numel())).reshape(
            w.shape[0], len(cols), *orig.shape[2:])

    def layer_inputs(self, lname: str, images: int,
                     kept: tuple[torch.Tensor | None, torch.Tensor | None] = (None, None)) -> LayerInputs | None:
        """Second moments of `lname`'s inputs in the float model over the first `images` calib images
        (a grouped conv's per group; None for a layer they are not measured on); `kept`: the (rows, columns)
        of the weight structured pruning keeps (None: all), whose inputs alone are returned. Measured
        once per image count for every layer (`gptq.input_hessians`), shared by runs on the workload;
        charged by `input_cost`.
        """
        x = self.workload.split(Split.CALIB).x.part(0, images)  # prepared batch by batch as the pass reads them
        cache = self.workload.input_cache
        if x.shape[0] not in cache:
            t0 = time.perf_counter()
            with self.workload.weights(self.workload.original):
                cache[x.shape[0]] = input_hessians(self.workload.model, self.workload.modules, x,
                                                   self.workload.batch_size)
            self.one_time.timed(f"layer_inputs:{x.shape[0]}", time.perf_counter() - t0)
        inputs = cache[x.shape[0]].get(lname)
        rows, cols = kept
        if inputs is None:
            return None
        if rows is not None and inputs.groups > 1:  # a grouped conv keeps the groups its kept rows are in
            per_group = self.workload.original[lname].shape[0] // inputs.groups
            groups = torch.unique(rows // per_group)
            if groups.numel() * per_group != rows.numel():
                return None  # a partial group: no second moments fit it (nearest rounding)
            inputs = inputs.select_groups(groups)
        if cols is not None:
            inputs = inputs.select(input_columns(cols, self.workload.original[lname][0, 0].numel()))
        return inputs

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
        state.update({k: t for k, t in self.skip_state(plan).items() if k not in state})
        if removals := self.removals(plan):  # the removed channels' norms and biases, zeroed in the float model
            zero = zeroed(self.workload.model, removals)
            state.update({k: t for k, t in zero.items() if k not in state and k.rsplit(".", 1)[0] in self._zeroable})
        key = plan.key if plan.key not in self._fitted else f"{plan.key}+fitted"  # its own statistics
        stats, cost = self.norm_stats.recalibrated(key, self._norm_images(plan), state)
        pre = sum(self.one_time.charge(k, c) for k, c in self._pre_passes.items())
        return {**state, **stats}, (cost + self.input_qparams(plan)[1] + self.input_cost(plan) + pre
                                    + self._skip_cost(plan))

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
        # Removed branches change what the layers after them see: their ranges are measured on that model.
        skips = self._skip_key(plan) if bits else ""
        for calib in {c for _, c in bits.values()}:
            x = self.workload.split(Split.CALIB).x.part(0, calib.images)
            if (calib, skips) not in self._input_ranges:
                with self.workload.state(self.skip_state(plan)):
                    self._input_ranges[calib, skips] = input_ranges(self.workload.model, self.workload.modules, x,
                                                                    calib, self.workload.batch_size)
            key = f"input_ranges:{calib}" + (f"+{skips}" if skips else "")
            cost += self.one_time.charge(key, x.shape[0] / len(self.workload.split(Split.VAL)))
        return {n: InputQParams.from_range(*self._input_ranges[c, skips][n], b) for n, (b, c) in bits.items()}, cost

    def _input_bits(self, plan: Plan) -> dict[str, tuple[int, Calibration]]:
        """{layer: (input bits, how its range is measured)} for the plan's activation-quantized layers."""
        bits: dict[str, tuple[int, Calibration]] = {}
        gone = self.skipped_layers(plan)  # a removed branch's layers see nothing
        for layer in self.workload.layers:
            if layer.name in gone:
                continue
            for d in self._layer_decisions[layer.name]:
                comp, c = self.space.compressors[d.compressor], plan.get(d.name)
                b = comp.precision(c).activation
                if b < 32 and (layer.name not in bits or b < bits[layer.name][0]):
                    bits[layer.name] = (b, comp.calibration(c).input_ranges or Calibration())
        return bits

    def _norm_images(self, plan: Plan) -> int:
        """Calibration images the plan's batch-norm statistics are re-estimated on (0: none)."""
        n = max((self.space.compressors[d.compressor].calibration(plan.get(d.name)).norm_images
                 for d in self.space.decisions), default=0)
        return min(n, len(self.workload.split(Split.CALIB))) if self.norm_stats.norms else 0

    # ---- one-time preparations ------------------------------------------------------------

    def _input_images(self, plan: Plan) -> set[int]:
        """Calibration image counts whose layer inputs the plan's choices need (GPTQ)."""
        calib = len(self.workload.split(Split.CALIB))
        return {min(n, calib) for d in self.space.decisions
                if (n := self.space.compressors[d.compressor].calibration(plan.get(d.name)).layer_inputs)}

    def input_cost(self, plan: Plan) -> float:
        """Budget the plan's calibrated choices cost now: the float pass measuring layer inputs, charged
        to the first plan of the run that needs it (images / len(val)), then 0."""
        val = len(self.workload.split(Split.VAL))
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
        skips = self._skip_key(plan)
        keys = {f"input_ranges:{c}" + (f"+{skips}" if skips else "") for _, c in self._input_bits(plan).values()}
        keys |= {f"layer_inputs:{n}" for n in self._input_images(plan)} | set(self._pre_passes)
        if n := self._norm_images(plan):
            keys.add(f"norm_reference:{n}")
        if skips:
            keys.add(f"skip:{skips}")
        self.one_time.mark_paid(keys | self.routes.one_time_keys(plan))

    # ---- the deployable module ------------------------------------------------------------

    def physical_model(self, plan: Plan) -> nn.Module:
        """A copy of the model holding the plan's weights, with structurally pruned channels
        physically removed (smaller Conv2d/BatchNorm2d): same outputs as the evaluated model."""
        state, _ = self.compressed_state(plan)
        with self.workload.state(state):
            model = copy.deepcopy(self.workload.model)
        removals = self.removals(plan)
        if not removals:
            return model
        groups = self.workload.analyses.get(ChannelAnalysis).groups
        assert groups is not None, "removals come from the workload's channel groups"
        return groups.remove(model, removals)

    def engine_model(self, plan: Plan) -> nn.Module:
        """`physical_model` with the blocks whose branches the plan removes rebuilt without them
        (`branches.skipped_block`): what engines run (ONNX export, the torch engine)."""
        model = self.physical_model(plan)
        for b in self.skipped(plan):
            parent, _, child = b.block.rpartition(".")
            owner = model.get_submodule(parent) if parent else model
            block = owner.get_submodule(child)
            end = block.get_submodule(b.end[len(b.block) + 1:])
            setattr(owner, child, skipped_block(block, end.get_parameter("bias").detach()))
        return model

    def deployable(self, plan: Plan) -> nn.Module:
        """The module the plan deploys as: `engine_model`, its quantized inputs quantized as scored (the
        hooks `modelopt.load` puts back), routed as the plan routes (an early-exit network that really returns
        at the first confident exit): what the torch engine runs and times."""
        model = self.engine_model(plan)
        qparams, _ = self.input_qparams(plan)
        if qparams:
            install_input_quantizers(compressible_modules(model), qparams)
        return self.routes.deployable(model, plan)

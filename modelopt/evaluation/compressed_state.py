"""What a plan runs with on the resident model: its `Realised` record, the state it swaps in, the module it deploys as.

`CompressedStates` builds a plan's `Realised` record from the plan and its refit (`realise`; each layer's weight from
`modelopt.evaluation.layer_weights`), and what running one takes: the tensors swapped in (the weights, the removed
channels' norms zeroed, batch-norm statistics re-estimated: `modelopt.evaluation.norm_stats`, cached by the record's
key), activation ranges calibrated, and every one-time preparation charged to the first plan that needs it
(`modelopt.evaluation.prep_costs`). It also builds the module a record deploys as (`physical_model`, `deployable`).
Scoring lives in `modelopt.evaluation.scorer`, cost accounting in `modelopt.evaluation.cost`.
"""

from __future__ import annotations

import contextlib
import copy

import torch
from torch import nn

from modelopt.compressors.contract import (
    Calibration,
    InputQParams,
    fake_quantized_inputs,
    input_ranges,
    install_input_quantizers,
)
from modelopt.data.split import Split
from modelopt.evaluation.fitted import Fitted
from modelopt.evaluation.forms import Steps
from modelopt.evaluation.layer_weights import SKIP_IMAGES, LayerWeights
from modelopt.evaluation.norm_stats import NormStats
from modelopt.evaluation.prep_costs import OneTimeCosts
from modelopt.evaluation.realised import Realised
from modelopt.evaluation.routes import PlanRoutes
from modelopt.model.branches import skipped_block
from modelopt.model.channels import ChannelAnalysis, zeroed
from modelopt.model.layers import compressible_modules
from modelopt.model.workload import Workload
from modelopt.plan.plan import Plan
from modelopt.plan.space import SearchSpace

__all__ = ["CompressedStates"]


class CompressedStates:
    """Realises plans on the workload's model and builds what they run with.

    Args:
        workload: The resident model, its original weights and splits.
        space: The decisions and their compressors.
        one_time: Where one-time preparations are charged (shared with the scorer and exits).
        routes: Where samples leave the plan's forward pass (early exit), for `deployable`.

    Example:
        >>> one_time = OneTimeCosts()
        >>> states = CompressedStates(wl, space, one_time, PlanRoutes(wl, space, one_time))
        >>> r = states.realise(plan)
        >>> state, cost = states.compressed_state(r)
        >>> with wl.state(state), states.activation_quant(r):
        ...     logits = wl.logits(x)                 # or, the same: states.logits(r, x)
    """

    def __init__(self, workload: Workload, space: SearchSpace, one_time: OneTimeCosts, routes: PlanRoutes) -> None:
        self.workload, self.space, self.one_time, self.routes = workload, space, one_time, routes
        self.layers = LayerWeights(workload, space, one_time)
        # Modules whose removed channels are zeroed by name (norms, biases), besides the compressed weights.
        self._zeroable = {n for n, m in workload.model.named_modules() if list(m.parameters(recurse=False))}
        # (calibration, removed blocks) -> every layer's input range (activation quantization)
        self._input_ranges: dict[tuple[Calibration, str], dict[str, tuple[float, float]]] = {}
        self.norm_stats = NormStats(workload, one_time)  # batch norms re-estimated per realised plan
        self._pre_passes: dict[str, float] = {}  # a strategy's passes before any plan (add_pre_pass)

    # ---- the record -----------------------------------------------------------------------

    def realise(self, target: Plan | Realised, fitted: Fitted | None = None) -> Realised:
        """The plan as it runs: as composed, or with its refit `fitted` (`modelopt.reconstruct`) in place of the
        weights its cached per-layer compression gives. A `Realised` is returned as it is (`fitted` must be None)."""
        if isinstance(target, Realised):
            if fitted is not None and fitted is not target.fitted:
                raise ValueError(f"plan {target.plan.key} is realised already; realise its plan with the refit")
            return target
        plan, lw = target, self.layers
        if fitted is not None and fitted.plan_key != plan.key:
            raise ValueError(f"the refit of plan {fitted.plan_key} does not belong to plan {plan.key}")
        weights = lw.weights(plan)
        refit = {} if fitted is None else {n: w.to(self.workload.original[n].device, self.workload.original[n].dtype)
                                           for n, w in fitted.weights.items()}
        run_fitted = None if fitted is None else Fitted(fitted.plan_key, refit, fitted.integers, fitted.errors,
                                                         fitted.images, fitted.seconds, fitted.held_out)
        return Realised(
            plan=plan, fitted=fitted, kept=lw.kept_channels(plan), slices=lw.kept_slices(plan),
            removals=lw.removals(plan), skipped=lw.skipped(plan), route=self.routes.route(plan),
            layer_keys=lw.layer_keys(plan), weights={**weights, **refit}, reference=lw.skip_state(plan),
            steps=Steps([x.name for x in self.workload.layers], lambda layer: lw.steps(plan, layer, run_fitted)))

    def compressed_weights(self, target: Plan | Realised) -> dict[str, torch.Tensor]:
        """The weights the plan runs with, full shape (structurally pruned channels are zero)."""
        return dict(self.realise(target).weights)

    def _skip_cost(self, plan: Plan) -> float:
        if not self.layers.skipped(plan):
            return 0.0
        images = min(SKIP_IMAGES, len(self.workload.split(Split.CALIB)))
        key = f"skip:{self.layers.skip_key(plan)}"
        return self.one_time.charge(key, 3 * images / len(self.workload.split(Split.VAL)))

    # ---- the state a plan swaps in --------------------------------------------------------

    def compressed_state(self, target: Plan | Realised) -> tuple[dict[str, torch.Tensor], float]:
        """Every tensor the plan changes, by state_dict name, and the budget spent preparing them.

        Weights; for structured pruning, the norm's scale and shift zeroed on removed channels
        (so the ReLU after it outputs exactly 0 there); after any pruning, every batch norm's
        statistics re-estimated on calibration images (cached by the record's key: a reconstructed plan has its
        own). The budget includes calibrating activation ranges (`input_qparams`) the first time a plan needs them:
        that runs the float model, so it happens here, before the plan's tensors are swapped in.
        """
        r = self.realise(target)
        plan = r.plan
        state = {f"{name}.weight": w for name, w in r.weights.items()}
        state.update({k: t for k, t in r.reference.items() if k not in state})
        if r.removals:  # the removed channels' norms and biases, zeroed in the float model
            zero = zeroed(self.workload.model, r.removals)
            state.update({k: t for k, t in zero.items() if k not in state and k.rsplit(".", 1)[0] in self._zeroable})
        stats, cost = self.norm_stats.recalibrated(r.key, self._norm_images(plan), state)
        pre = sum(self.one_time.charge(k, c) for k, c in self._pre_passes.items())
        return {**state, **stats}, (cost + self.input_qparams(r)[1] + self.input_cost(plan) + pre
                                    + self._skip_cost(plan))

    def activation_quant(self, target: Plan | Realised) -> contextlib.AbstractContextManager[None]:
        """Within the block, the plan's activation-quantized layers see their inputs quantize-dequantized.

        Ranges are static (as a deployed integer model has them): calibrated on the float model,
        once per `Calibration` (`input_qparams`), and shared by every plan. Enter it inside
        `workload.state(...)` of `compressed_state(plan)`'s tensors, which calibrated them first.
        """
        qparams, _ = self.input_qparams(target)
        return fake_quantized_inputs(self.workload.modules, qparams) if qparams else contextlib.nullcontext()

    def logits(self, target: Plan | Realised, x: torch.Tensor) -> torch.Tensor:
        """The plan's logits on `x` as scored (compressed weights, quantized activations; no exits):
        what an exported model must reproduce."""
        r = self.realise(target)
        state, _ = self.compressed_state(r)
        with torch.inference_mode(), self.workload.state(state), self.activation_quant(r):
            return self.workload.logits(x)

    def input_qparams(self, target: Plan | Realised) -> tuple[dict[str, InputQParams], float]:
        """Per activation-quantized layer of the plan, its input's quantization; and the budget
        calibrating cost now: images / len(val) the first time a `Calibration` is needed, else 0.

        One pass of the float model over the calib split's first `Calibration.images` images
        measures every layer's input range; call it while the float model is resident.
        """
        r = self.realise(target)
        bits = self._input_bits(r.plan)
        cost = 0.0
        # Removed branches change what the layers after them see: their ranges are measured on that model.
        skips = self.layers.skip_key(r.plan) if bits else ""
        for calib in {c for _, c in bits.values()}:
            x = self.workload.split(Split.CALIB).x.part(0, calib.images)
            if (calib, skips) not in self._input_ranges:
                with self.workload.state(r.reference):
                    self._input_ranges[calib, skips] = input_ranges(self.workload.model, self.workload.modules, x,
                                                                    calib, self.workload.batch_size)
            key = f"input_ranges:{calib}" + (f"+{skips}" if skips else "")
            cost += self.one_time.charge(key, x.shape[0] / len(self.workload.split(Split.VAL)))
        return {n: InputQParams.from_range(*self._input_ranges[c, skips][n], b) for n, (b, c) in bits.items()}, cost

    def _input_bits(self, plan: Plan) -> dict[str, tuple[int, Calibration]]:
        """{layer: (input bits, how its range is measured)} for the plan's activation-quantized layers."""
        bits: dict[str, tuple[int, Calibration]] = {}
        gone = {name for b in self.layers.skipped(plan) for name in b.layers}  # a removed branch's layers see nothing
        for layer in self.workload.layers:
            if layer.name in gone:
                continue
            for d in self.layers.decisions(layer.name):
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
        skips = self.layers.skip_key(plan)
        keys = {f"input_ranges:{c}" + (f"+{skips}" if skips else "") for _, c in self._input_bits(plan).values()}
        keys |= {f"layer_inputs:{n}" for n in self._input_images(plan)} | set(self._pre_passes)
        if n := self._norm_images(plan):
            keys.add(f"norm_reference:{n}")
        if skips:
            keys.add(f"skip:{skips}")
        self.one_time.mark_paid(keys | self.routes.one_time_keys(plan))

    # ---- the deployable module ------------------------------------------------------------

    def physical_model(self, target: Plan | Realised) -> nn.Module:
        """A copy of the model holding the plan's weights, with structurally pruned channels
        physically removed (smaller Conv2d/BatchNorm2d): same outputs as the evaluated model."""
        r = self.realise(target)
        state, _ = self.compressed_state(r)
        with self.workload.state(state):
            model = copy.deepcopy(self.workload.model)
        if not r.removals:
            return model
        groups = self.workload.analyses.get(ChannelAnalysis).groups
        assert groups is not None, "removals come from the workload's channel groups"
        return groups.remove(model, r.removals)

    def engine_model(self, target: Plan | Realised) -> nn.Module:
        """`physical_model` with the blocks whose branches the plan removes rebuilt without them
        (`branches.skipped_block`): what engines run (ONNX export, the torch engine)."""
        r = self.realise(target)
        model = self.physical_model(r)
        for b in r.skipped:
            parent, _, child = b.block.rpartition(".")
            owner = model.get_submodule(parent) if parent else model
            block = owner.get_submodule(child)
            end = block.get_submodule(b.end[len(b.block) + 1:])
            setattr(owner, child, skipped_block(block, end.get_parameter("bias").detach()))
        return model

    def deployable(self, target: Plan | Realised) -> nn.Module:
        """The module the plan deploys as: `engine_model`, its quantized inputs quantized as scored (the
        hooks `modelopt.load` puts back), routed as the plan routes (an early-exit network that really returns
        at the first confident exit): what the torch engine runs and times."""
        r = self.realise(target)
        model = self.engine_model(r)
        qparams, _ = self.input_qparams(r)
        if qparams:
            install_input_quantizers(compressible_modules(model), qparams)
        return self.routes.deployable(model, r.plan)

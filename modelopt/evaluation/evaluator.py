"""The evaluator: applies a plan to the resident model and scores it on a split.

`Evaluator` is the one object the runner, strategies' pre-passes, export and latency hold. It is
assembled from one part per seam, each in its own module:

- `modelopt.evaluation.cost.CostModel`: bytes, MACs and bitops of a plan (the one cost accounting);
- `modelopt.evaluation.compressed_state.CompressedStates`: the tensors a plan swaps in (compressed weights,
  structured pruning, batch-norm statistics, activation ranges) and the module it deploys as;
- `modelopt.evaluation.scorer.Scorer`: forward passes over a split, whole or in stages, into `Metrics`;
- `modelopt.compressors.early_exit.plan_exits.PlanExits`: a plan's exits, their heads and priors;
- `modelopt.evaluation.priors.measure_errors`: measured per-choice errors for the strategies' priors.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Mapping

import torch
from torch import nn

from modelopt.compressors._base import Storage
from modelopt.compressors.activations import InputQParams
from modelopt.compressors.early_exit.heads import ExitHead
from modelopt.compressors.early_exit.plan_exits import PlanExits
from modelopt.compressors.early_exit.runtime import ExitLayout
from modelopt.compressors.early_exit.simulate import ExitPolicy
from modelopt.evaluation.compressed_state import CompressedStates, Kept
from modelopt.evaluation.cost import CostModel, LayerCost, PlanCost
from modelopt.evaluation.fidelity import Fidelity
from modelopt.evaluation.metrics import Metrics
from modelopt.evaluation.prep_costs import OneTimeCosts
from modelopt.evaluation.priors import measure_errors
from modelopt.evaluation.scorer import Scorer
from modelopt.model.layer_inputs import LayerInputs
from modelopt.model.layers import Layer
from modelopt.model.workload import Workload
from modelopt.plan.plan import Plan
from modelopt.plan.space import SearchSpace

__all__ = ["Evaluator", "Metrics"]


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
        self.one_time = OneTimeCosts()  # reference passes, fits, calibrations: charged once per run
        self.exits = PlanExits(workload, space, exit_images, self.one_time)  # early exit's heads, priors, reach
        self.costs = CostModel(space, workload.other_bytes)
        self.states = CompressedStates(workload, space, self.one_time, self.exits)
        self.norm_stats = self.states.norm_stats  # batch norms re-estimated per plan
        self.scorer = Scorer(workload, self.states, self.exits, self.plan_cost)

    # ---- cost accounting (modelopt.evaluation.cost) --------------------------------------------------

    def plan_cost(self, plan: Plan) -> PlanCost:
        """The plan's bytes, MACs and bitops per layer, with the channels structured pruning keeps."""
        return self.costs.cost(plan, {name: int(idx.numel()) for name, (_, idx) in self.kept_channels(plan).items()})

    def _layer_cost(self, plan: Plan, layer: Layer) -> LayerCost:
        return next(x for x in self.plan_cost(plan).layers if x.layer.name == layer.name)

    def stored_layer(self, plan: Plan, layer: Layer) -> Layer:
        """`layer` as the plan stores and runs it: structured pruning's kept channels, MACs scaled."""
        return self._layer_cost(plan, layer).layer

    def storage(self, plan: Plan, layer: Layer) -> Storage:
        """How the plan stores `layer`'s weight: its compressors' chain, in order (prune, then quantize)."""
        return self._layer_cost(plan, layer).storage

    def size_bytes(self, plan: Plan) -> int:
        return self.plan_cost(plan).size_bytes

    def macs(self, plan: Plan) -> int:
        """Multiply-accumulates per sample under the plan (structured pruning lowers them)."""
        return self.plan_cost(plan).macs()

    def weight_bits(self, plan: Plan, layer: str) -> int:
        return self._layer_cost(plan, self.space.layers[layer]).weight_bits

    def activation_bits(self, plan: Plan, layer: str) -> int:
        """Bits of the layer's input activations under the plan (32: float)."""
        return self._layer_cost(plan, self.space.layers[layer]).activation_bits

    def bitops(self, plan: Plan, reach: dict[str, float] | None = None) -> int:
        """Bit operations per sample; `reach`: the share of samples that run each layer (early exit)."""
        return self.plan_cost(plan).bitops(reach)

    def float_bitops(self) -> int:
        return self.workload.macs * 32 * 32

    def measure_errors(self) -> None:
        """Replaces the space's estimated per-choice errors by measured ones (`modelopt.evaluation.priors`)."""
        measure_errors(self.states, self.exits)

    # ---- early exit (modelopt.compressors.early_exit.plan_exits) ---------------------------------------

    def exit_layout(self) -> ExitLayout | None:
        """Where the space's candidate exits sit (None when no early_exit decision is offered)."""
        return self.exits.layout()

    def exit_policy(self, plan: Plan) -> ExitPolicy | None:
        """The plan's active exits and thresholds; None when it has none."""
        return self.exits.policy(plan)

    def exit_heads(self) -> tuple[dict[str, ExitHead], float]:
        """The fitted head of every candidate exit, and the budget fitting them cost now (0 once fitted)."""
        return self.exits.heads()

    # ---- compressed state (modelopt.evaluation.compressed_state) --------------------------------------

    def kept_channels(self, plan: Plan) -> Kept:
        """{conv1 layer: (decision, ascending kept output channels)} for the plan's structured pruning."""
        return self.states.kept_channels(plan)

    def compressed_weights(self, plan: Plan) -> dict[str, torch.Tensor]:
        """The weights the plan runs with, full shape (structurally pruned channels are zero)."""
        return self.states.compressed_weights(plan)

    def layer_inputs(self, lname: str, images: int, kept_inputs: torch.Tensor | None = None) -> LayerInputs | None:
        """Second moments of `lname`'s inputs in the float model (`CompressedStates.layer_inputs`)."""
        return self.states.layer_inputs(lname, images, kept_inputs)

    def input_cost(self, plan: Plan) -> float:
        """Budget the plan's calibrated choices cost now (charged once per run)."""
        return self.states.input_cost(plan)

    def add_pre_pass(self, key: str, cost: float) -> None:
        """Records work done for the search before any plan, charged with the first plan scored after it."""
        self.states.add_pre_pass(key, cost)

    def compressed_state(self, plan: Plan) -> tuple[dict[str, torch.Tensor], float]:
        """Every tensor the plan changes, by state_dict name, and the budget spent preparing them."""
        return self.states.compressed_state(plan)

    def activation_quant(self, plan: Plan) -> contextlib.AbstractContextManager[None]:
        """Within the block, the plan's activation-quantized layers see their inputs quantize-dequantized.

        Example:
            >>> state, _ = ev.compressed_state(plan)
            >>> with ev.workload.state(state), ev.activation_quant(plan):
            ...     logits = ev.workload.logits(x)
        """
        return self.states.activation_quant(plan)

    def logits(self, plan: Plan, x: torch.Tensor) -> torch.Tensor:
        """The plan's logits on `x` as scored (compressed weights, quantized activations; no exits):
        what an exported model must reproduce."""
        state, _ = self.compressed_state(plan)
        with torch.inference_mode(), self.workload.state(state), self.activation_quant(plan):
            return self.workload.logits(x)

    def input_qparams(self, plan: Plan) -> tuple[dict[str, InputQParams], float]:
        """Per activation-quantized layer, its input's quantization, and the budget calibrating cost now."""
        return self.states.input_qparams(plan)

    def settle(self, metrics: Metrics, charges: Mapping[str, float]) -> Metrics:
        """`metrics` of a plan scored elsewhere (a worker that charged it `charges`, every one-time
        preparation it needed, in full), charged as this run charges: each preparation once, to the
        first trial recorded that needed it, and this run's own pre-passes with the first of all."""
        due = {**charges, **self.states.pre_passes}
        paid = [self.one_time.charge(key, cost) for key, cost in due.items()]
        if all(p == due[k] for p, k in zip(paid, due, strict=True)) and not self.states.pre_passes:
            return metrics  # everything it charged is this run's first: the worker's sum stands as it is
        return dataclasses.replace(metrics, prep_cost=metrics.prep_cost - sum(charges.values()) + sum(paid))

    def mark_paid(self, plan: Plan) -> None:
        """Records the one-time preparations `plan` needed as paid (a resumed run)."""
        self.states.mark_paid(plan)

    def physical_model(self, plan: Plan) -> nn.Module:
        """A copy of the model holding the plan's weights, structurally pruned channels removed.

        Example:
            >>> small = ev.physical_model(plan)
            >>> modelopt.latency.torch_latency(small, x, batch_size=64)
        """
        return self.states.physical_model(plan)

    def deployable(self, plan: Plan) -> nn.Module:
        """The module the plan deploys as (an `EarlyExitNet` when it has exits)."""
        return self.states.deployable(plan)

    # ---- scoring (modelopt.evaluation.scorer) ---------------------------------------------------------

    def cost(self, split: str = "val", n: int | None = None) -> float:
        """Budget charged for scoring one plan on n samples of a split: n / len(val)."""
        return self.scorer.cost(split, n)

    def trial_cost(self, metrics: Metrics) -> float:
        """Budget a scored plan costs: the samples scored plus its preparation (`Metrics.prep_cost`)."""
        return self.scorer.trial_cost(metrics)

    def evaluate(self, plan: Plan, split: str = "val", n: int | None = None) -> Metrics:
        """Scores `plan` on the first `n` samples of `split` (all when None).

        Raises:
            TrialError: when the compressed model yields non-finite outputs.
        """
        return self.scorer.evaluate(plan, split, n)

    def evaluate_staged(self, plan: Plan, min_retention: float, fidelity: Fidelity, *, finish: bool = True,
                        confidence: float = 0.0, count_gains: bool = True, claim_images: int | None = None) -> Metrics:
        """Scores `plan` on the val split in stages, stopping once the rest cannot matter
        (`Scorer.evaluate_staged`)."""
        return self.scorer.evaluate_staged(plan, min_retention, fidelity, finish=finish, confidence=confidence,
                                           count_gains=count_gains, claim_images=claim_images)

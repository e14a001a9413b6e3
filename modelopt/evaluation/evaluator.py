"""The evaluator: the parts that apply a plan to the resident model and score it, wired together once.

`Evaluator` is the one object the runner, strategies' pre-passes, export and latency hold. It forwards
nothing: callers use its parts, one per seam, each in its own module:

- `costs` (`modelopt.evaluation.cost.CostModel`): bytes, MACs and bitops of a plan (the one cost
  accounting); `plan_cost(plan)` prices a plan with the channels structured pruning really keeps;
- `states` (`modelopt.evaluation.compressed_state.CompressedStates`): the tensors a plan swaps in
  (compressed weights, structured pruning, batch-norm statistics, activation ranges), the logits it
  gives and the module it deploys as;
- `scorer` (`modelopt.evaluation.scorer.Scorer`): forward passes over a split, whole or in stages, into
  `Metrics`, and the budget a plan costs;
- `routes` (`modelopt.evaluation.routes.PlanRoutes`): where each sample leaves a plan's forward pass (the
  `Routing` a compressor such as early exit offers);
- `one_time` (`modelopt.evaluation.prep_costs.OneTimeCosts`): preparations charged once per run.

Measured priors for the strategies come from `modelopt.evaluation.priors.measure_errors(evaluator)`.
"""

from __future__ import annotations

from modelopt.evaluation.compressed_state import CompressedStates
from modelopt.evaluation.cost import CostModel, PlanCost
from modelopt.evaluation.fitted import Fitted
from modelopt.evaluation.metrics import Metrics
from modelopt.evaluation.prep_costs import OneTimeCosts
from modelopt.evaluation.routes import PlanRoutes
from modelopt.evaluation.scorer import Scorer
from modelopt.model.workload import Workload
from modelopt.plan.plan import Plan
from modelopt.plan.space import SearchSpace

__all__ = ["Evaluator", "Metrics"]


class Evaluator:
    """Scores plans: cached compressed tensors per (layer, choices), results cached by plan key.

    Example:
        >>> ev = Evaluator(workload, space)
        >>> ev.scorer.evaluate(space.uniform("quantize", QuantSpec(8)), split="val").retention
        >>> ev.plan_cost(plan).size_bytes
    """

    def __init__(self, workload: Workload, space: SearchSpace) -> None:
        self.workload = workload
        self.space = space
        self.one_time = OneTimeCosts()  # reference passes, fits, calibrations: charged once per run
        self.routes = PlanRoutes(workload, space, self.one_time)  # where samples leave (early exit)
        self.costs = CostModel(space, workload.other_bytes)
        self.states = CompressedStates(workload, space, self.one_time, self.routes)
        self.scorer = Scorer(workload, self.states, self.routes, self.plan_cost)

    def adopt(self, fitted: Fitted) -> None:
        """The plan `fitted.plan_key` runs, scores, deploys and exports with its reconstructed weights from now
        on (`modelopt.reconstruct`); its cached scores are dropped."""
        self.states.adopt(fitted)
        self.scorer.forget(fitted.plan_key)

    def drop(self, plan_key: str) -> None:
        """The plan runs, scores and exports as composed again, its reconstruction dropped (`adopt`)."""
        self.states.drop(plan_key)
        self.scorer.forget(plan_key)

    def plan_cost(self, plan: Plan) -> PlanCost:
        """The plan's bytes, MACs and bitops per layer, with the channels its structured pruning keeps."""
        kept = self.states.kept_channels(plan)
        return self.costs.cost(plan, {name: int(idx.numel()) for name, (_, idx) in kept.items()})

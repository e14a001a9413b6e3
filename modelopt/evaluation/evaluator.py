"""The evaluator: the parts that realise a plan on the resident model and score it, wired together once.

`Evaluator` is the one object the runner, strategies' pre-passes, export and latency hold. A plan as it runs is a
value: `realise(plan, fitted)` builds its `Realised` record (`modelopt.evaluation.realised`) from the plan and its
reconstruction, if any; every verb below takes one, or a plan, which it realises as composed. Nothing is adopted or
dropped: what a plan scores depends on the record alone. The parts, one per seam, each in its own module:

- `costs` (`modelopt.evaluation.cost.CostModel`): bytes, MACs and bitops of a plan (the one cost
  accounting); `plan_cost(plan)` prices a plan with the channels structured pruning really keeps;
- `states` (`modelopt.evaluation.compressed_state.CompressedStates`): the records, the tensors a record swaps in
  (compressed weights, structured pruning, batch-norm statistics, activation ranges), the module it deploys as;
- `scorer` (`modelopt.evaluation.scorer.Scorer`): forward passes over a split, whole or in stages, into
  `Metrics`, and the budget a plan costs;
- `routes` (`modelopt.evaluation.routes.PlanRoutes`): where each sample leaves a plan's forward pass (the
  `Routing` a compressor such as early exit offers);
- `one_time` (`modelopt.evaluation.prep_costs.OneTimeCosts`): preparations charged once per run.

Measured priors for the strategies come from `modelopt.evaluation.priors.measure_errors(evaluator)`.
"""

from __future__ import annotations

import torch
from torch import nn

from modelopt.compressors.contract import InputQParams
from modelopt.data.split import Split
from modelopt.evaluation.coded import coded_bytes
from modelopt.evaluation.compressed_state import CompressedStates
from modelopt.evaluation.cost import CostModel, PlanCost
from modelopt.evaluation.fidelity import Fidelity
from modelopt.evaluation.fitted import Fitted
from modelopt.evaluation.metrics import Metrics
from modelopt.evaluation.prep_costs import OneTimeCosts
from modelopt.evaluation.realised import Realised
from modelopt.evaluation.routes import PlanRoutes
from modelopt.evaluation.scorer import Engine, Predictions, Scorer
from modelopt.model.images import Images
from modelopt.model.workload import Workload
from modelopt.plan.plan import Plan
from modelopt.plan.space import SearchSpace

__all__ = ["Evaluator", "Metrics", "Realised"]

PlanOrRecord = Plan | Realised  # a plan (run as composed) or a record of one as it runs


class Evaluator:
    """Realises and scores plans: cached compressed tensors per (layer, choices), results cached by record key.

    Example:
        >>> ev = Evaluator(workload, space)
        >>> ev.evaluate(space.uniform("quantize", QuantSpec(8)), split="val").retention
        >>> ev.evaluate(ev.realise(plan, fitted), split="confirm")      # as reconstructed
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

    def realise(self, plan: PlanOrRecord, fitted: Fitted | None = None) -> Realised:
        """The plan as it runs: as composed, or with its reconstruction `fitted` (`modelopt.reconstruct`)."""
        return self.states.realise(plan, fitted)

    def plan_cost(self, plan: PlanOrRecord) -> PlanCost:
        """The plan's bytes, MACs and bitops per layer, with the channels its structured pruning keeps and the
        bytes its codes take once coded (measured on them: a refitted record's own codes)."""
        fitted = plan.fitted if isinstance(plan, Realised) else None
        plan = plan.plan if isinstance(plan, Realised) else plan
        layers = self.states.layers
        kept = {name: int(idx.numel()) for name, (_, idx) in layers.kept_channels(plan).items()}
        return self.costs.cost(plan, kept, coded_bytes(layers, plan, fitted))

    # ---- scoring (`Scorer`) ----------------------------------------------------------------

    def evaluate(self, plan: PlanOrRecord, split: str = Split.VAL, n: int | None = None) -> Metrics:
        """The plan's metrics on the first `n` images of `split` (all when None); cached by record key."""
        return self.scorer.evaluate(plan, split, n)

    def evaluate_staged(self, plan: PlanOrRecord, min_retention: float, fidelity: Fidelity, *, finish: bool = True,
                        confidence: float = 0.0, count_gains: bool = True, claim_images: int | None = None) -> Metrics:
        """The plan scored on val in stages, stopping once the rest cannot matter (`Scorer.evaluate_staged`)."""
        return self.scorer.evaluate_staged(plan, min_retention, fidelity, finish=finish, confidence=confidence,
                                           count_gains=count_gains, claim_images=claim_images)

    def answers(self, plan: PlanOrRecord, split: str) -> Predictions:
        """The plan's top-1 on every image of `split` and, with exits, where each left, as it is scored."""
        return self.scorer.answers(plan, split)

    def answers_on(self, plan: PlanOrRecord, x: Images) -> Predictions:
        """`answers` on images `x` of no split (unlabeled ones)."""
        return self.scorer.answers_on(plan, x)

    def score_in(self, engine: Engine | None) -> None:
        """From now on plans are scored in `engine` (the run's latency engine when its answers differ from the
        PyTorch simulation), not in the simulation; None: in the simulation again."""
        self.scorer.engine = engine

    @property
    def engine(self) -> Engine | None:
        """Where plans are scored when not in the PyTorch simulation (`score_in`)."""
        return self.scorer.engine

    # ---- what a plan runs as (`CompressedStates`) -------------------------------------------

    def state(self, plan: PlanOrRecord) -> dict[str, torch.Tensor]:
        """Every tensor the plan swaps into the resident model, by state_dict name."""
        return self.states.compressed_state(plan)[0]

    def input_qparams(self, plan: PlanOrRecord) -> dict[str, InputQParams]:
        """Per layer whose inputs the plan quantizes, their quantization (ranges calibrated on the float model)."""
        return self.states.input_qparams(plan)[0]

    def physical_model(self, plan: PlanOrRecord) -> nn.Module:
        """A copy of the model running the plan, structurally pruned channels physically removed."""
        return self.states.physical_model(plan)

    def engine_model(self, plan: PlanOrRecord) -> nn.Module:
        """`physical_model` with the residual branches the plan removes gone: what engines run."""
        return self.states.engine_model(plan)

    def deployable(self, plan: PlanOrRecord) -> nn.Module:
        """The module the plan deploys as: `engine_model`, inputs quantized and exits routed as scored."""
        return self.states.deployable(plan)

    def add_pre_pass(self, key: str, cost: float) -> None:
        """Work done for the search before any plan, charged once with the first plan scored after it."""
        self.states.add_pre_pass(key, cost)

    def mark_paid(self, plan: Plan) -> None:
        """The one-time preparations `plan` needed, recorded as paid (a resumed run, for its journal's trials)."""
        self.states.mark_paid(plan)

"""The evaluator's early-exit part: which exits a plan turns on, their heads (fitted once and charged
once), the priors strategies read, and where each sample left (see `modelopt.compressors.early_exit.runtime`)."""

from __future__ import annotations

import dataclasses
import math

import torch

from modelopt.compressors.early_exit.compressor import EarlyExit, ExitChoice
from modelopt.compressors.early_exit.heads import ExitHead
from modelopt.compressors.early_exit.runtime import (
    ExitLayout,
    ExitProbe,
    decide,
    exit_layout,
    fit_heads,
)
from modelopt.compressors.early_exit.simulate import ExitPolicy
from modelopt.errors import TrialError
from modelopt.evaluation.prep_costs import OneTimeCosts
from modelopt.model.workload import Workload
from modelopt.plan.plan import Plan
from modelopt.plan.space import SearchSpace

__all__ = ["PlanExits"]


class PlanExits:
    """Early exit for one evaluator's workload and space.

    Args:
        workload: The resident model and splits.
        space: Its decisions; those of `EarlyExit` compressors are the candidate exits.
        extra_images: Normalised images (never val or test) the heads are fitted on besides the
            calib split; their feature pass is charged with the fit.

    Example:
        >>> exits = PlanExits(wl, space)
        >>> policy, cost = exits.setup(plan)
        >>> pred, exit_at = exits.predict(plan, x, policy)
    """

    def __init__(self, workload: Workload, space: SearchSpace, extra_images: torch.Tensor | None = None,
                 one_time: OneTimeCosts | None = None) -> None:
        self.workload, self.space = workload, space
        self.one_time = OneTimeCosts() if one_time is None else one_time
        self.decisions = [d for d in space.decisions
                          if isinstance(space.compressors[d.compressor], EarlyExit)]
        self._extra = extra_images
        self._layout: ExitLayout | None = None
        self._heads: dict[str, ExitHead] | None = None
        self._fit_cost = 0.0
        self._priors = False  # computed: their val pass is charged to the run's first trial

    def layout(self) -> ExitLayout | None:
        """Where the candidate exits sit (None when the space offers none)."""
        if not self.decisions:
            return None
        if self._layout is None:
            _, _, height, width = self.workload.split("val").x.shape
            self._layout = exit_layout(self.workload.model, (height, width), [d.layer for d in self.decisions],
                                       [x.name for x in self.workload.layers])
        return self._layout

    def policy(self, plan: Plan) -> ExitPolicy | None:
        """The plan's active exits and thresholds; None when it has none."""
        layout = self.layout()
        if layout is None:
            return None
        choices = {d.layer: plan.get(d.name) for d in self.decisions}
        if all(c is None for c in choices.values()):
            return None
        return layout.policy(choices)

    def heads(self) -> tuple[dict[str, ExitHead], float]:
        """The fitted head of every candidate exit, and the budget fitting them cost now (0 once fitted).
        Fitted once, on the float model."""
        layout = self.layout()
        assert layout is not None, "the space offers no early exit"
        if self._heads is not None:
            return self._heads, 0.0
        val = self.workload.split("val")
        self._heads, images = fit_heads(layout, self.workload.split("calib").x, val.x, extra=self._extra)
        self._fit_cost = images / len(val)
        return self._heads, self._fit_cost

    def setup(self, plan: Plan) -> tuple[ExitPolicy | None, float]:
        """The plan's policy and the budget to charge its trial: the heads' fit and the priors' val
        pass, to the run's first trial that needs them (`OneTimeCosts`)."""
        policy = self.policy(plan)
        if policy is not None:
            self.heads()
        cost = 0.0
        for key in self.one_time_keys(plan):
            cost += self.one_time.charge(key, self._fit_cost if key == "exit_heads" else 1.0)
        return policy, cost

    def one_time_keys(self, plan: Plan) -> set[str]:
        """The one-time preparations a trial of `plan` is charged for, when first."""
        keys = {"exit_heads", "exit_priors"} if self._priors else set()
        if self.policy(plan) is not None:
            keys.add("exit_heads")
        return keys

    def predict(self, plan: Plan, x: torch.Tensor, policy: ExitPolicy) -> tuple[torch.Tensor, torch.Tensor]:
        """Predictions for `x` with the plan's weights in place, and the position in `policy.exits`
        each sample left at (len(policy.exits): it ran the whole network)."""
        heads, _ = self.heads()
        assert self._layout is not None
        with ExitProbe(self._layout, heads, policy) as probe:
            logits = self.workload.logits(x)
        head_logits = probe.logits()
        if not torch.isfinite(logits).all() or not all(torch.isfinite(t).all() for t in head_logits.values()):
            raise TrialError(f"plan {plan.key} gives non-finite outputs")
        exit_at, pred = decide(head_logits, logits, heads, policy)
        return pred, exit_at

    def reach(self, policy: ExitPolicy, exit_at: torch.Tensor) -> dict[str, float]:
        """Per layer, the share of samples that ran it."""
        layout = self._layout
        assert layout is not None
        n = max(1, int(exit_at.numel()))
        # A sample leaving at exit j ran every block up to and including exit j's block.
        last_block = torch.tensor([layout.block_index(e) for e in policy.exits] + [len(layout.backbone.blocks)],
                                  device=exit_at.device)[exit_at]
        return {x.name: float((last_block >= layout.block_of[x.name]).sum()) / n for x in self.workload.layers}

    def head_macs(self, policy: ExitPolicy, exit_at: torch.Tensor) -> float:
        """Mean head MACs per sample: a sample evaluated every active head up to where it left."""
        layout = self._layout
        assert layout is not None
        n = max(1, int(exit_at.numel()))
        return sum(layout.head_macs(e) * float((exit_at >= j).sum()) / n for j, e in enumerate(policy.exits))

    def priors(self) -> None:
        """Per exit choice, what strategies may expect before trying it: the MACs it saves and an
        accuracy-loss proxy, from the fitted heads on the float model over val (the share of images
        that would leave there alone, and of those whose head disagrees with the full model).

        The loss proxy is put on the weight-error scale the strategies' priors read (`error`):
        sqrt(expected drop) / 0.5, the square root of the drop per unit of relative weight error
        the MCTS starts from. Fitting the heads and this val pass are charged to the next trial.
        """
        heads, _ = self.heads()
        layout = self._layout
        assert layout is not None
        points = tuple(p.name for p in layout.backbone.points if p.name in heads)
        every = ExitPolicy(points, tuple(2.0 for _ in points))  # heads run, nobody leaves
        with ExitProbe(layout, heads, every) as probe:
            full = self.workload.logits(self.workload.split("val").x).argmax(1)
        logits = probe.logits()
        self._priors = True
        total = layout.backbone.total_macs
        for d in self.decisions:
            point = layout.point_of[d.layer]
            conf = heads[point].confidence(logits[point])
            differs = logits[point].argmax(1) != full
            after = total - layout.backbone.point(point).macs
            feats = []
            for c, f in zip(d.choices, self.space.features[d.name], strict=True):
                if c is None:
                    feats.append(f)
                    continue
                assert isinstance(c, ExitChoice)
                fire = conf >= c.threshold
                share, wrong = float(fire.double().mean()), float((fire & differs).double().mean())
                saved = share * after - layout.head_macs(point)
                feats.append(dataclasses.replace(f, macs=round(f.macs - saved), error=math.sqrt(0.9 * wrong) / 0.5))
            self.space.features[d.name] = tuple(feats)

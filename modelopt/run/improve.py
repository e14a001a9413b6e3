"""Whether a plan can still beat the best feasible plan so far, before it is scored (multi-fidelity's early stop)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from modelopt.evaluation.evaluator import Evaluator
from modelopt.evaluation.trial import Trial
from modelopt.objective import Objective, Target, best_of
from modelopt.plan.plan import Plan

__all__ = ["best_text", "cannot_improve", "target_value"]


def target_value(evaluator: Evaluator, objective: Objective, plan: Plan) -> float:
    """The objective's target for `plan`, known before scoring it (sizes and bitops are static)."""
    target = objective.target
    if target is Target.SIZE:
        return float(evaluator.plan_cost(plan).size_bytes)
    if target is Target.BITOPS:
        return float(evaluator.plan_cost(plan).bitops())
    if target is Target.LATENCY:
        return -math.inf  # only known once measured: never skipped as unable to improve
    return float(evaluator.plan_cost(plan).macs())


def cannot_improve(evaluator: Evaluator, objective: Objective, trials: Sequence[Trial], plan: Plan) -> bool:
    """True when `plan` cannot beat the best feasible plan so far, whatever its accuracy."""
    feasible = [objective.value(t.metrics) for t in trials if t.feasible and t.metrics is not None]
    return bool(feasible) and target_value(evaluator, objective, plan) > min(feasible)


def best_text(trials: Sequence[Trial], objective: Objective) -> str:
    """The progress line's best so far, e.g. 'best 9.03x size at 99.57% retention (trial 1)'."""
    best = best_of([t for t in trials if t.ok], lambda t: t.scored, objective)
    if best is None:
        return "no feasible plan yet"
    m = best.scored
    return f"best {m.compression:.2f}x size at {m.retention:.2%} retention (trial {best.number})"

"""Confirmation: the images that select a plan are not the images that vouch for it.

The search scores hundreds of plans on val and keeps the best; near the floor the winner is
partly the plan whose val images were kindest (the winner's curse). So before any claim the
finalists (the val-feasible plans of the Pareto front, the best among them) are re-scored on the
confirm split, which the search never saw, and a plan is *confirmed* when its retention bound
there clears the floor.

Finalists are tested in a fixed sequence, safest first (by their val agreement with the float
model, then size), and the sequence stops at the first plan that fails. Fixed-sequence testing
keeps the chance of confirming any plan that is in truth below the floor within 1 - confidence
without a correction for the number of finalists (each claim is tested at the full level only if
every safer claim before it held; the order is fixed from val alone), and the reported best is
the smallest plan confirmed.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TypeVar

from rich.console import Console

from modelopt.confidence import PairedCounts
from modelopt.errors import ConfigError
from modelopt.evaluator import Evaluator
from modelopt.fidelity import binom_upper
from modelopt.metrics import Metrics
from modelopt.objective import Objective, best_of, pareto_front
from modelopt.trial import Trial

__all__ = ["Confirmation", "Finalists", "certifiable_retention", "check_certifiable", "confirm", "finalists"]

T = TypeVar("T")
SPLIT = "confirm"
MAX_RESCORED = 16  # Pareto plans re-scored on confirm and test (spread along the front)


@dataclass(frozen=True)
class Finalists:
    """The search's own pick on val, its Pareto front (by the val retention bound, at most
    `MAX_RESCORED` plans spread along it), and the plans among them that go to confirmation."""

    search_best: Trial | None
    front: tuple[Trial, ...]
    candidates: tuple[Trial, ...]


def _spread(items: list[T], k: int) -> list[T]:
    """At most k items spread evenly along the list (its ends kept)."""
    if len(items) <= k:
        return items
    return [items[i] for i in sorted({round(i * (len(items) - 1) / (k - 1)) for i in range(k)})]


def finalists(trials: list[Trial], objective: Objective) -> Finalists:
    """What a finished search hands to confirmation: its best, and the val-feasible plans of two fronts.

    The retention front (size against the val retention bound) holds the plans val rates best; the
    agreement front (size against the val agreement bound, the share of images whose prediction the
    plan keeps) holds those that change fewest predictions. A plan whose val retention rests on
    gains (images it fixes that the float model got wrong) offsetting losses is often lucky on a few
    hundred images; one that changes few predictions carries over to new images, so both go on.
    """
    ok = [t for t in trials if t.ok]
    best = best_of(ok, _scored, objective)
    front = _spread(pareto_front(ok, _scored, objective), MAX_RESCORED)
    agree = _spread(pareto_front(ok, lambda t: _as_agreement(_scored(t), objective.confidence),
                                 Objective(objective.target, 0.0, 0.0)), MAX_RESCORED)
    feasible = [t for t in ([best] if best else []) + front + agree
                if t.metrics is not None and objective.feasible(t.metrics)]
    return Finalists(best, tuple(front), tuple(dict.fromkeys(feasible)))


def _as_agreement(m: Metrics, confidence: float) -> Metrics:
    """`m` with its retention replaced by a lower bound on its agreement (for the agreement front)."""
    changed = round((1.0 - m.agreement) * m.n_samples)
    low = 1.0 - binom_upper(changed, m.n_samples, 1.0 - confidence) if confidence > 0 else m.agreement
    return dataclasses.replace(m, retention=low, base_right=None, lost=None, gained=None)


@dataclass(frozen=True)
class Confirmation:
    """What the confirm split said about the search's finalists.

    Attributes:
        split: the split that vouched ("confirm"), or None when the data have none (the best
            plan is then the search's, unconfirmed).
        finalists: each finalist and its confirm metrics, in the order tested (safest first).
        confirmed: how many finalists, from the first, were confirmed before the first failure.
        best: the smallest confirmed plan (None when none was, or when there is no confirm split).
        ceiling: the retention bound a plan that agrees with the float model on every confirm
            image would get: below the floor, the split is too small to confirm anything, and
            nothing was re-scored (the run then reports its best as certified on val only).
    """

    split: str | None
    finalists: tuple[tuple[Trial, Metrics], ...]
    confirmed: int
    best: Trial | None
    ceiling: float | None
    floor: float = 0.0

    @property
    def usable(self) -> bool:
        """Whether the confirm split exists and is large enough to confirm a plan at the floor."""
        return self.split is not None and self.ceiling is not None and self.ceiling >= self.floor - 1e-12


def certifiable_retention(evaluator: Evaluator, split: str, confidence: float) -> float:
    """The retention bound of a plan that agrees with the float model on every image of `split`:
    the most that split can certify at `confidence`."""
    data = evaluator.workload.split(split)
    return PairedCounts(len(data), int(data.base_correct.sum()), 0, 0).retention_lower(confidence)


def check_certifiable(evaluator: Evaluator, objective: Objective, console: Console | None = None) -> None:
    """Refuses, in one line, a val split too small to certify the floor even for a plan that agrees
    with the float model on every image (the search would be pointless); says so for confirm."""
    if objective.confidence <= 0:
        return
    floor, conf = objective.min_retention, objective.confidence
    for split in ("val", SPLIT):
        if split not in evaluator.workload.splits:
            continue
        ceiling = certifiable_retention(evaluator, split, conf)
        if ceiling >= floor - 1e-12:
            continue
        n = len(evaluator.workload.split(split))
        said = (f"the {split} split ({n} images) is too small to certify a {floor:.1%} retention floor: a plan "
                f"that agrees with the float model on all of them is certified only at {ceiling:.2%} "
                f"(confidence {conf:g})")
        if split == "val":
            raise ConfigError(f"{said}; pass more data, a lower --min-retention, or --confidence 0 for point estimates")
        if console is not None:
            console.print(f"[yellow]warning:[/] {said}; the best plan will be certified on val only and reported "
                          "as unconfirmed", highlight=False, soft_wrap=True)


def confirm(evaluator: Evaluator, objective: Objective, finalists: list[Trial]) -> Confirmation:
    """Re-scores `finalists` on the confirm split and confirms them in a fixed sequence.

    Args:
        evaluator: scores plans (its workload must hold a confirm split, else nothing is re-scored).
        objective: the floor, the confidence, and the target that orders the finalists.
        finalists: val-feasible plans (any order; duplicates by plan key are dropped).

    Example:
        >>> c = confirm(ev, Objective("size", 0.99, 0.95), finalists)
        >>> c.best.number if c.best else None
    """
    if SPLIT not in evaluator.workload.splits:
        return Confirmation(None, (), 0, None, None, objective.min_retention)
    ceiling = certifiable_retention(evaluator, SPLIT, objective.confidence)
    if ceiling < objective.min_retention - 1e-12:
        return Confirmation(SPLIT, (), 0, None, ceiling, objective.min_retention)
    unique = list({t.plan.key: t for t in finalists if t.metrics is not None}.values())
    # Safest first: the order is fixed from val alone (most agreement with the float model first,
    # then the larger plan), so the confirm split's verdicts cannot reorder it.
    order = sorted(unique, key=lambda t: (-_as_agreement(_scored(t), objective.confidence).retention,
                                          -objective.value(_scored(t))))
    scored: list[tuple[Trial, Metrics]] = []
    for t in order:  # the sequence stops at the first failure: nothing after it could be claimed
        scored.append((t, evaluator.evaluate(t.plan, split=SPLIT)))
        if not objective.meets_floor(scored[-1][1]):
            break
    confirmed = sum(objective.meets_floor(m) for _, m in scored)
    held = [t for t, _ in scored[:confirmed]]
    best = min(held, key=lambda t: (objective.value(_scored(t)), -objective.retention_lower(_scored(t))),
               default=None)
    return Confirmation(SPLIT, tuple(scored), confirmed, best, ceiling, objective.min_retention)


def _scored(trial: Trial) -> Metrics:
    return trial.scored

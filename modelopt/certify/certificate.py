"""The one entry to the promise: from a search's trials to the plan a run may report, and its figures.

`certify` picks the finalists on val (`modelopt.certify.confirm.finalists`), confirms them on images that did
not select them (`confirm_plans`), takes the smallest confirmed plan (the search's best, unconfirmed, when the
data cannot confirm), checks that the plan as deployed answers as the certified one did (`check_deployed`,
when a run measures latency in an engine), and scores the final set on the held-out test split. The runner
and the sweep tables both call it, so a table reports the plan its run did.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from modelopt.certify.confirm import Confirmation, confirm_plans, finalists
from modelopt.certify.deployed import Deployed, check_deployed
from modelopt.data.split import Split
from modelopt.evaluation.evaluator import Evaluator, Realised
from modelopt.evaluation.fitted import Fitted
from modelopt.evaluation.metrics import Metrics
from modelopt.evaluation.trial import Trial
from modelopt.latency.plan import PlanLatency
from modelopt.objective import Objective, best_of
from modelopt.plan.plan import Plan

__all__ = ["Certificate", "certify"]


@dataclass(frozen=True)
class Certificate:
    """What a run may claim, and on which images.

    Attributes:
        best: the reported plan: the smallest confirmed on the confirm split, or the search's best on the val
            bound (unconfirmed) when the data have no confirm split able to certify the floor; None when no
            plan is feasible.
        search_best: the search's own pick on val (a search-time estimate).
        front: the Pareto front on the val bound (at most `MAX_RESCORED` plans spread along it).
        anchors: the uniform plans the run scored (`SearchSpace.anchors`), reported beside the best.
        confirmation: what the confirm split said about the finalists.
        deployed: how the best plan's deployed answers compared with its certified ones (None: not checked).
        test: each reported plan's metrics on the test split, by plan key (best, search best, front, anchors);
            None when `certify` was asked not to score test.
    """

    best: Trial | None
    search_best: Trial | None
    front: tuple[Trial, ...]
    anchors: tuple[Trial, ...]
    confirmation: Confirmation
    deployed: Deployed | None = None
    test: dict[str, Metrics] | None = None

    @property
    def confirmed(self) -> bool:
        """Whether the reported best was confirmed on images that did not select it (False: no plan is reported,
        or the data could not confirm one and the search's best is reported on its val bound)."""
        return self.best is not None and self.confirmation.usable

    def realise(self, evaluator: Evaluator, plan: Plan) -> Realised:
        """`plan` as the run certified it: with the reconstruction it was confirmed with, else as composed."""
        return self.confirmation.realise(evaluator, plan)

    @property
    def curve(self) -> tuple[tuple[float, Trial | None], ...]:
        """The smallest plan certified at each floor of the run's curve, highest floor first (None: none); empty
        when the data could not confirm (a one-floor run's single point is its best)."""
        return self.confirmation.curve if self.confirmation.usable else ()

    @property
    def reported(self) -> dict[str, Trial]:
        """The plans whose test figures a run reports, by plan key: the best, the search's, the curve's points,
        the front, the anchors (each once, in that order)."""
        trials = ([self.best] if self.best else []) + ([self.search_best] if self.search_best else [])
        points = [t for _, t in self.curve if t is not None]
        return {t.plan.key: t for t in [*trials, *points, *self.front, *self.anchors]}


def certify(evaluator: Evaluator, objective: Objective, trials: list[Trial], latency: PlanLatency | None = None,
            *, test: bool = True, refit: Callable[[Plan], Fitted | None] | None = None,
            max_claims: int | None = None) -> Certificate:
    """The plan a run of `trials` may report, confirmed, checked as deployed, and scored on test.

    Args:
        evaluator: scores plans on the confirm and test splits.
        objective: the floor, the confidence and the target.
        trials: every trial of the run, in order (its anchors among them).
        latency: where the run measures latency; with an engine, the best plan is checked as deployed there
            and, where its answers differ, the next confirmed plan is (`check_deployed`). None: not checked.
        test: score the reported plans on the test split (False: choose only, as a sweep table does for the
            budgets below a run's own).
        refit: the reconstruction each finalist runs with, fitted before it is confirmed
            (`modelopt.reconstruct.store.Refits`; None: the plans are confirmed as the search composed them).
        max_claims: the most claims each floor's search sequence may test (a timed run's,
            `modelopt.run.time_plan`); None: as many as the planner finds worth testing.

    Example:
        >>> cert = certify(ev, Objective("size", 0.99, 0.95), trials)
        >>> cert.best.number, cert.confirmation.usable, cert.test[cert.best.plan.key].retention
    """
    anchor_keys = [p.key for p in objective.anchors(evaluator.space)] if objective.confidence > 0 else []
    final = finalists(trials, objective.search, anchor_keys)  # a curve's finalists: plans for its lowest floor too
    confirmation = confirm_plans(evaluator, objective, list(final.candidates), final.anchors, trials, refit,
                                 max_claims)
    # With a confirm split the reported best is the smallest plan it confirmed; without one (or with one too
    # small to certify the floor), the search's best on the val bound, unconfirmed.
    unconfirmed = final.search_best if not objective.floors else best_of([t for t in trials if t.ok],
                                                                          lambda t: t.scored, objective)
    best = confirmation.best if confirmation.usable else unconfirmed
    deployed = None
    if best is not None and latency is not None:  # deployed equals certified, or the next plan is reported
        best, deployed = check_deployed(latency, _reportable(best, confirmation, objective),
                                        lambda plan: confirmation.realise(evaluator, plan))
    cert = Certificate(best, final.search_best, final.front, final.anchors, confirmation, deployed)
    if not test:
        return cert
    return dataclasses.replace(cert, test={key: evaluator.evaluate(cert.realise(evaluator, t.plan), split=Split.TEST)
                                           for key, t in cert.reported.items()})


def _reportable(best: Trial, confirmation: Confirmation, objective: Objective) -> list[Trial]:
    """`best`, then the other confirmed plans from the best objective value on: what may be reported."""
    held = [t for (t, _), ok in zip(confirmation.finalists, confirmation.verdicts, strict=False)
            if ok and t.plan.key != best.plan.key]
    return [best, *sorted(held, key=lambda t: objective.value(t.scored))]

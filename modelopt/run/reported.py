"""The record of each plan a run reports, built once from its certificate: the figures every table selects from.

`reported_plans` takes a `Certificate` (`modelopt.certify.certify`) apart once, at the end of a run: for the
reported best, the search's own pick, the front and the anchors, one `PlanEntry` each, holding the plan's
`Scores` on every split it was scored on (its metrics, its retention bounds at the run's confidence, the bound
the objective certifies, its reduction on the objective's target and whether its retention holds the floor),
with the test figures as the run measured them (latency added where it timed the plans). summary.json saves
these entries, `RunResult` carries them, and the CLI, the run and sweep reports and the sweep tables select
columns from them: none works a figure out again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from modelopt.certify.certificate import Certificate
from modelopt.confidence import clears
from modelopt.data.split import Split
from modelopt.evaluation.metrics import Metrics
from modelopt.evaluation.trial import Trial
from modelopt.objective import Objective
from modelopt.plan.space import SearchSpace

__all__ = ["CurvePoint", "PlanEntry", "ReportedPlans", "Scores", "reported_plans"]


@dataclass(frozen=True)
class Scores:
    """A plan's figures on one split.

    Attributes:
        metrics: what the split measured.
        retention_lower, retention_upper: retention's one-sided bounds at the run's confidence (the point estimate
            at confidence 0); None in a file from before the bounds were saved.
        retention_certified: the bound the objective certifies (val: at the size of the claim); None likewise.
        reduction: the objective's reduction factor (float value / plan value: compression for size); not saved
            (summary.json holds the metrics and the objective it follows from); None without an objective.
        held: whether the retention (the point estimate) meets the floor; not saved either.
    """

    metrics: Metrics
    retention_lower: float | None = None
    retention_upper: float | None = None
    retention_certified: float | None = None
    reduction: float | None = field(default=None, compare=False)
    held: bool | None = field(default=None, compare=False)

    @classmethod
    def of(cls, m: Metrics, objective: Objective) -> Scores:
        """The figures of `m` under `objective`: the one place a reported figure is worked out."""
        lo, hi = m.retention_bounds(objective.confidence)
        return cls(m, lo, hi, objective.retention_lower(m), *_derived(m, objective))

    def to_json(self) -> dict[str, Any]:
        return {**self.metrics.to_dict(), "retention_lower": self.retention_lower,
                "retention_upper": self.retention_upper, "retention_certified": self.retention_certified}

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None, objective: Objective | None = None) -> Scores | None:
        """Scores as summary.json saved them; a bound the file lacks stays None (not made up)."""
        if not d:
            return None
        m = Metrics.from_dict(dict(d))
        derived = (None, None) if objective is None else _derived(m, objective)
        return cls(m, _float(d.get("retention_lower")), _float(d.get("retention_upper")),
                   _float(d.get("retention_certified")), *derived)

    @property
    def interval(self) -> tuple[float, float] | None:
        """(lower, upper) retention bounds when they are known and apart (None: a point estimate)."""
        lo, hi = self.retention_lower, self.retention_upper
        if lo is None or hi is None or lo != lo or lo == hi:  # lo != lo: NaN
            return None
        return lo, hi


def _derived(m: Metrics, objective: Objective) -> tuple[float, bool]:
    return objective.reduction(m), clears(m.retention, objective.min_retention)


@dataclass(frozen=True)
class PlanEntry:
    """One plan a run reports, with its figures on each split it was scored on.

    `confirmed` is set on the reported best only (whether images that did not select it confirmed it:
    `Certificate.confirmed`); `name` on an anchor only ("INT4": the uniform plan it is).
    """

    trial: int
    plan_key: str
    plan: dict[str, Any] = field(hash=False)  # the plan file's form (`SearchSpace.dump_plan`)
    test: Scores | None = None
    confirm: Scores | None = None
    val: Scores | None = None
    confirmed: bool | None = None
    name: str | None = None

    @property
    def headline(self) -> Scores | None:
        """The figures a one-line summary states: test's, else confirm's, else val's."""
        return self.test or self.confirm or self.val

    def metrics_on(self, split: str) -> Metrics | None:
        """The metrics on `split` (test, confirm or val; None: not scored there)."""
        by_split: dict[str, Scores | None] = {Split.TEST: self.test, Split.CONFIRM: self.confirm, Split.VAL: self.val}
        scores = by_split.get(split)
        return None if scores is None else scores.metrics

    def to_json(self) -> dict[str, Any]:
        out = {"trial": self.trial, "plan_key": self.plan_key, "plan": self.plan, Split.TEST: _json(self.test),
               Split.CONFIRM: _json(self.confirm), Split.VAL: _json(self.val)}
        if self.confirmed is not None:
            out["confirmed"] = self.confirmed
        if self.name is not None:
            out["name"] = self.name
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None, objective: Objective | None = None) -> PlanEntry | None:
        if not d:
            return None
        confirmed = d.get("confirmed")
        return cls(int(d["trial"]), str(d["plan_key"]), dict(d.get("plan") or {}),
                   Scores.from_json(d.get(Split.TEST), objective), Scores.from_json(d.get(Split.CONFIRM), objective),
                   Scores.from_json(d.get(Split.VAL), objective), None if confirmed is None else bool(confirmed),
                   d.get("name"))


@dataclass(frozen=True)
class CurvePoint:
    """One floor of a certified curve: the smallest plan certified at it (None: nothing cleared it), and the
    uniform plans certified there, by name ("INT4")."""

    floor: float
    plan: PlanEntry | None = None
    uniform: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"floor": self.floor, "plan": _json(self.plan), "uniform": list(self.uniform)}

    @classmethod
    def from_json(cls, d: Mapping[str, Any], objective: Objective | None = None) -> CurvePoint:
        return cls(float(d["floor"]), PlanEntry.from_json(d.get("plan"), objective),
                   tuple(str(u) for u in d.get("uniform") or ()))


@dataclass(frozen=True)
class ReportedPlans:
    """The plans a run reports, each once as a `PlanEntry`: the best (None: no plan is reported), the search's
    own pick on val, the anchors (uniform plans) and the val Pareto front, each re-scored on test."""

    best: PlanEntry | None
    search_best: PlanEntry | None
    anchors: tuple[PlanEntry, ...] = ()
    pareto: tuple[PlanEntry, ...] = ()
    curve: tuple[CurvePoint, ...] = ()  # one point per floor, highest first (`Objective.curve`)


def reported_plans(certificate: Certificate, objective: Objective, space: SearchSpace,
                   test: Mapping[str, Metrics]) -> ReportedPlans:
    """The record of each plan `certificate` reports.

    Args:
        certificate: what the run may claim (`modelopt.certify.certify`).
        objective: the run's objective (the bounds, the reduction and the floor each figure is given with).
        space: the run's search space (plan files, anchor names).
        test: each reported plan's test metrics by plan key, as the run measured them (the certificate's
            `test`, with the latency the run timed).

    Example:
        >>> plans = reported_plans(cert, objective, evaluator.space, cert.test)
        >>> plans.best.test.retention_lower, plans.best.confirmed
    """
    confirmed = {t.plan.key: m for t, m in certificate.confirmation.finalists}

    def scores(m: Metrics | None) -> Scores | None:
        return None if m is None else Scores.of(m, objective)

    def entry(t: Trial, **extra: Any) -> PlanEntry:
        return PlanEntry(t.number, t.plan.key, space.dump_plan(t.plan), scores(test.get(t.plan.key)),
                         scores(confirmed.get(t.plan.key)), scores(t.metrics), **extra)

    best, search_best = certificate.best, certificate.search_best
    return ReportedPlans(
        best=None if best is None else entry(best, confirmed=certificate.confirmed),
        search_best=None if search_best is None else entry(search_best),
        anchors=tuple(entry(t, name=uniform_name(space, t)) for t in certificate.anchors),
        pareto=tuple(entry(t) for t in certificate.front),
        curve=tuple(CurvePoint(f, None if t is None else entry(t),
                               tuple(uniform_name(space, a) for a in certificate.anchors
                                     if a.plan.key in certificate.confirmation.held_at(f)))
                    for f, t in certificate.curve),
    )


def uniform_name(space: SearchSpace, trial: Trial) -> str:
    """"INT4" for a plan whose compressed layers all store 4-bit weights ("W8A8" with 8-bit inputs too),
    "float" for the uncompressed model."""
    chosen = [(space.compressors[d.compressor], c) for d in space.decisions
              if (c := trial.plan.get(d.name)) is not None]
    if not chosen:
        return "float"
    precisions = [comp.precision(c) for comp, c in chosen]
    bits = {p.weight for p in precisions}
    acts = {p.activation for p in precisions}
    if len(bits) == 2 and len(acts) == 1 and 32 in acts:  # a hedge: the narrow width, its sensitive layers wider
        narrow, wide = sorted(bits)
        n_wide = sum(p.weight == wide for p in precisions)
        return f"INT{narrow}, {n_wide} of {len(chosen)} INT{wide}"
    if len(bits) != 1:
        return "mixed"
    width = bits.pop()
    return f"W{width}A{acts.pop()}" if len(acts) == 1 and 32 not in acts else f"INT{width}"


def _json(record: Scores | PlanEntry | None) -> dict[str, Any] | None:
    return None if record is None else record.to_json()


def _float(v: Any) -> float | None:
    return None if v is None else float(v)

"""A finished run's summary.json as frozen records: the reported best with its test, confirm and val
figures, the confirmation, the anchors, the Pareto front, and what the run spent.

Each plan's figures are one `PlanEntry` (`modelopt.run.reported`, built once from the run's certificate);
`summarize` builds a `RunSummary` from those and what the runner holds at the end; `RunSummary.to_json` is the
file's layout and `RunSummary.from_json` reads it back, older files included (a key they lack takes
its default). Readers (the CLI, reports, sweeps) use the records' attributes, never the file's keys.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from modelopt._version import __version__
from modelopt.certify.certificate import Certificate
from modelopt.certify.deployed import Deployed
from modelopt.config.run_config import RunConfig
from modelopt.data.split import Split
from modelopt.errors import ModeloptError
from modelopt.evaluation.evaluator import Evaluator
from modelopt.evaluation.metrics import Metrics
from modelopt.evaluation.trial import Trial
from modelopt.objective import Objective, Target
from modelopt.run.exit_pattern import ExitPattern
from modelopt.run.journal import read_json
from modelopt.run.layout import SUMMARY
from modelopt.run.reported import CurvePoint, PlanEntry, ReportedPlans, Scores

log = logging.getLogger(__name__)

# PlanEntry and Scores (the record of each reported plan) live in `modelopt.run.reported`; named here too, as before.
__all__ = ["Baseline", "ConfirmationEntry", "Finalist", "PlanEntry", "Preparation", "RunSummary", "Scores",
           "read_summary", "summarize"]


@dataclass(frozen=True)
class Finalist:
    """A plan confirmation tested: its verdict, its chance to pass as predicted from val, its confirm figures."""

    trial: int
    plan_key: str
    confirmed: bool
    pass_chance: float | None = None
    confirm: Scores | None = None
    # The plan as the search composed it, on the same confirm images, when it was reconstructed before its
    # confirmation (`modelopt.reconstruct`); None: not reconstructed (`confirm` is then the composed plan's).
    composed: Scores | None = None

    def to_json(self) -> dict[str, Any]:
        return {"trial": self.trial, "plan_key": self.plan_key, "confirmed": self.confirmed,
                "pass_chance": self.pass_chance, Split.CONFIRM: _json(self.confirm),
                "composed": _json(self.composed)}

    @classmethod
    def from_json(cls, d: Mapping[str, Any], objective: Objective | None = None) -> Finalist:
        return cls(int(d["trial"]), str(d["plan_key"]), bool(d.get("confirmed", False)), _float(d.get("pass_chance")),
                   Scores.from_json(d.get(Split.CONFIRM), objective), Scores.from_json(d.get("composed"), objective))


@dataclass(frozen=True)
class ConfirmationEntry:
    """What the confirm split said (`modelopt.certify.confirm.Confirmation`, as saved).

    Attributes:
        split: the split that vouched, or None when the data have none.
        usable: whether that split is large enough to confirm a plan at the floor.
        ceiling: the bound a plan agreeing with the float model on every confirm image would get.
        confirmed: how many finalists were confirmed.
        finalists: each finalist tested, in the order tested.
    """

    split: str | None = None
    usable: bool = False
    ceiling: float | None = None
    confirmed: int = 0
    finalists: tuple[Finalist, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"split": self.split, "usable": self.usable, "ceiling": self.ceiling, "confirmed": self.confirmed,
                "finalists": [f.to_json() for f in self.finalists]}

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None, objective: Objective | None = None) -> ConfirmationEntry:
        d = d or {}
        return cls(d.get("split"), bool(d.get("usable", False)), _float(d.get("ceiling")), int(d.get("confirmed", 0)),
                   tuple(Finalist.from_json(f, objective) for f in d.get("finalists") or ()))


@dataclass(frozen=True)
class Baseline:
    """The float model on one split."""

    accuracy: float
    n_samples: int

    def to_json(self) -> dict[str, Any]:
        return {"accuracy": self.accuracy, "n_samples": self.n_samples}


@dataclass(frozen=True)
class Preparation:
    """One-time work, by preparation key: wall seconds in the process that wrote the summary, and the
    budget units the run was charged for it."""

    seconds: dict[str, float] = field(default_factory=dict, hash=False)
    charged: dict[str, float] = field(default_factory=dict, hash=False)

    def to_json(self) -> dict[str, Any]:
        return {"seconds": dict(self.seconds), "charged": dict(self.charged)}


@dataclass(frozen=True)
class RunSummary:
    """A finished run as summary.json holds it.

    `best` is the plan the run reports (confirmed on images that did not select it when the data have a
    confirm split); `search_best` the search's own pick on val, a search-time estimate. `anchors` are the
    uniform plans scored beside the search on the same images; `pareto` the val front, re-scored on test.

    Example:
        >>> s = read_summary("runs/r20")
        >>> s.best.test.metrics.compression if s and s.best and s.best.test else None
    """

    version: str = ""  # the package version that wrote it
    run_dir: str = ""
    config: dict[str, Any] = field(default_factory=dict, hash=False)  # `RunConfig.to_json()` of the run
    objective: Objective = field(default_factory=lambda: Objective(confidence=0.0, count_gains=False))
    budget: float = 0.0
    budget_used: float = 0.0
    n_trials: int = 0
    n_failed: int = 0
    n_feasible: int = 0
    baseline: dict[str, Baseline] = field(default_factory=dict, hash=False)  # by split
    float_size_bytes: int = 0  # 0: not recorded
    device: str = ""
    best: PlanEntry | None = None
    search_best: PlanEntry | None = None
    confirmation: ConfirmationEntry = ConfirmationEntry()
    anchors: tuple[PlanEntry, ...] = ()
    pareto: tuple[PlanEntry, ...] = ()
    preparation: Preparation = Preparation()
    search_wall_seconds: float = 0.0
    eval_seconds_this_session: float = 0.0
    deployed: Deployed | None = None  # the best plan built as deployed, against its certified answers
    # The float model's latency in every precision the engine was timed in, by figure name (the engine's default
    # first: the one the speed-ups are stated against), e.g. {"openvino/cpu/bf16/b1": .., "openvino/cpu/fp32/b1": ..}
    float_latency: dict[str, float] = field(default_factory=dict, hash=False)
    exits: ExitPattern | None = None  # where test images leave the best plan, and the float model with its exits
    curve: tuple[CurvePoint, ...] = ()  # the smallest plan certified at each floor, highest first (`--floors`)
    # Ctrl-C stopped the search before its budget: the plans certified are those of the trials so far, and a sweep
    # counts the cell as partial (its next run resumes the search).
    stopped: bool = False

    @property
    def confirmed(self) -> bool:
        """Whether the reported best was confirmed on images that did not select it."""
        return bool(self.best is not None and self.best.confirmed)

    def to_json(self) -> dict[str, Any]:
        """summary.json's layout."""
        o = self.objective
        return {
            "version": self.version,
            "run_dir": self.run_dir,
            "config": self.config,
            "objective": {"target": o.target.value, "min_retention": o.min_retention, "confidence": o.confidence,
                          "count_gains": o.count_gains, "claim_images": o.claim_images,
                          **({"floors": list(o.floors)} if o.floors else {})},
            "budget": self.budget if self.budget < math.inf else None,  # None: a timed run's open budget
            "budget_used": self.budget_used,
            "n_trials": self.n_trials,
            "n_failed": self.n_failed,
            "n_feasible": self.n_feasible,
            "baseline": {split: b.to_json() for split, b in self.baseline.items()},
            "float_size_bytes": self.float_size_bytes,
            "device": self.device,
            "best": _json(self.best),
            "search_best": _json(self.search_best),
            "confirmation": self.confirmation.to_json(),
            "anchors": [a.to_json() for a in self.anchors],
            "pareto": [p.to_json() for p in self.pareto],
            "preparation": self.preparation.to_json(),
            "search_wall_seconds": self.search_wall_seconds,
            "eval_seconds_this_session": self.eval_seconds_this_session,
            **({} if self.deployed is None else {"deployed": self.deployed.to_json()}),
            **({"float_latency": self.float_latency} if self.float_latency else {}),
            **({} if self.exits is None else {"exits": self.exits.to_json()}),
            **({} if not self.curve else {"curve": [p.to_json() for p in self.curve]}),
            **({"stopped": True} if self.stopped else {}),
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> RunSummary:
        """A summary.json; a key an older file lacks takes its default (a run from before a field existed
        ran without it: point estimates, bounds on breaks only, no anchors).

        Raises:
            KeyError, TypeError, ValueError, AttributeError, ModeloptError: not a summary (`read_summary`: None).
        """
        o, prep = d.get("objective") or {}, d.get("preparation") or {}
        floor, floors = float(o.get("min_retention", 0.99)), tuple(o.get("floors") or ())
        objective = Objective(Target.parse(o.get("target") or "size"), floor,
                              float(o.get("confidence") or 0.0), bool(o.get("count_gains", False)),
                              o.get("claim_images"), floors if floor in floors else ())
        return cls(
            version=str(d.get("version", "")),
            run_dir=str(d.get("run_dir", "")),
            config=dict(d.get("config") or {}),
            objective=objective,
            budget=math.inf if "budget" in d and d["budget"] is None else float(d.get("budget", 0.0)),
            budget_used=float(d.get("budget_used", 0.0)),
            n_trials=int(d.get("n_trials", 0)),
            n_failed=int(d.get("n_failed", 0)),
            n_feasible=int(d.get("n_feasible", 0)),
            baseline={split: Baseline(float(b["accuracy"]), int(b["n_samples"]))
                      for split, b in (d.get("baseline") or {}).items()},
            float_size_bytes=int(d.get("float_size_bytes") or 0),
            device=str(d.get("device", "")),
            best=PlanEntry.from_json(d.get("best"), objective),
            search_best=PlanEntry.from_json(d.get("search_best"), objective),
            confirmation=ConfirmationEntry.from_json(d.get("confirmation"), objective),
            anchors=_entries(d.get("anchors"), objective),
            pareto=_entries(d.get("pareto"), objective),
            preparation=Preparation(dict(prep.get("seconds") or {}), dict(prep.get("charged") or {})),
            search_wall_seconds=float(d.get("search_wall_seconds", 0.0)),
            eval_seconds_this_session=float(d.get("eval_seconds_this_session", 0.0)),
            deployed=None if not d.get("deployed") else Deployed(**d["deployed"]),
            float_latency={str(k): float(v) for k, v in (d.get("float_latency") or {}).items()},
            exits=ExitPattern.from_json(d.get("exits")),
            curve=tuple(CurvePoint.from_json(p, objective) for p in d.get("curve") or ()),
            stopped=bool(d.get("stopped", False)),
        )


def read_summary(run_dir: str | Path) -> RunSummary | None:
    """A run folder's summary.json, or None while the run has not finished (or when the file is unreadable).

    Example:
        >>> read_summary("runs/r20").budget_used
    """
    path = Path(run_dir) / SUMMARY
    doc = read_json(path)
    if doc is None:
        return None
    try:
        return RunSummary.from_json(doc)
    except (KeyError, TypeError, ValueError, AttributeError, ModeloptError) as exc:
        log.info("summary %s unreadable: %r", path, exc)
        return None


def summarize(
    *, evaluator: Evaluator, objective: Objective, config: RunConfig, run_dir: Path, budget: float,
    trials: Sequence[Trial], certificate: Certificate, plans: ReportedPlans, search_wall: float = 0.0,
    eval_seconds: float = 0.0, float_latency: Mapping[str, float] | None = None, exits: ExitPattern | None = None,
    stopped: bool = False,
) -> RunSummary:
    """The summary of a finished run.

    Args:
        evaluator: the run's evaluator (its workload's baselines, its one-time costs).
        objective: the run's objective (the bounds each figure is given with).
        config: the run's settings, saved whole.
        run_dir: the run folder.
        budget: the run's budget, in full val evaluations.
        trials: every trial of the run.
        certificate: what the run may claim (`modelopt.certify.certify`): the confirmation and the deployed check.
        plans: the record of each plan the certificate reports (`modelopt.run.reported.reported_plans`), saved
            as it is: the best, the search's own pick, the anchors and the front.
        search_wall: wall seconds of the search; eval_seconds: of the evaluations this session.
        stopped: Ctrl-C stopped the search before its budget.

    Example:
        >>> plans = reported_plans(cert, obj, ev.space, cert.test)
        >>> summarize(evaluator=ev, objective=obj, config=cfg, run_dir=out, budget=50, trials=trials,
        ...           certificate=cert, plans=plans).to_json()
    """
    wl, confirmation = evaluator.workload, certificate.confirmation

    def scores(m: Metrics | None) -> Scores | None:
        return None if m is None else Scores.of(m, objective)

    finalists = tuple(
        Finalist(t.number, t.plan.key, confirmation.verdicts[i],
                 confirmation.chances[i] if i < len(confirmation.chances) else None, scores(m),
                 scores(confirmation.composed[i]) if i < len(confirmation.composed) else None)
        for i, (t, m) in enumerate(confirmation.finalists))
    splits = (Split.VAL, Split.CONFIRM, Split.TEST) if Split.CONFIRM in wl.splits else (Split.VAL, Split.TEST)
    return RunSummary(
        version=__version__,
        run_dir=str(run_dir),
        config=config.to_json(),
        objective=objective,
        budget=budget,
        budget_used=sum(t.cost for t in trials),
        n_trials=len(trials),
        n_failed=sum(not t.ok for t in trials),
        n_feasible=sum(t.feasible for t in trials),
        baseline={s: Baseline(wl.baseline_accuracy(s), len(wl.split(s))) for s in splits},
        float_size_bytes=wl.float_size_bytes,
        device=str(wl.device),
        best=plans.best,
        search_best=plans.search_best,
        confirmation=ConfirmationEntry(confirmation.split, confirmation.usable, confirmation.ceiling,
                                       confirmation.confirmed, finalists),
        anchors=plans.anchors,
        pareto=plans.pareto,
        preparation=Preparation(dict(evaluator.one_time.seconds), dict(evaluator.one_time.charged)),
        search_wall_seconds=search_wall,
        eval_seconds_this_session=eval_seconds,
        deployed=certificate.deployed,
        float_latency=dict(float_latency or {}),
        exits=exits,
        curve=plans.curve,
        stopped=stopped,
    )


def _json(record: Scores | PlanEntry | None) -> dict[str, Any] | None:
    return None if record is None else record.to_json()


def _entries(raw: Sequence[Mapping[str, Any]] | None, objective: Objective) -> tuple[PlanEntry, ...]:
    return tuple(e for e in (PlanEntry.from_json(d, objective) for d in raw or ()) if e is not None)


def _float(v: Any) -> float | None:
    return None if v is None else float(v)

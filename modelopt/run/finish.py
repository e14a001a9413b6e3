"""The end of a run: its trials certified, the reported plans timed, the run folder's summary written.

`finish(ending, trials, search_wall)` is what the runner does once its search stops: `certify` (the finalists
reconstructed, confirmed, the best checked as deployed and the reported plans scored on test), the reported plans
timed again in the run's engine, `best_plan.yaml` and `summary.json` written, and the `RunResult` the API returns.
Every reported plan is run as it was certified (`Certificate.realise`: reconstructed where it was).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from modelopt.certify.certificate import Certificate, certify
from modelopt.certify.confirm import Confirmation
from modelopt.config.run_config import RunConfig
from modelopt.data.split import Split
from modelopt.evaluation.evaluator import Evaluator, Metrics, Realised
from modelopt.evaluation.trial import Trial
from modelopt.latency.plan import PlanLatency
from modelopt.objective import Objective
from modelopt.plan.plan import Plan
from modelopt.reconstruct.store import Refits
from modelopt.run.exit_pattern import exit_pattern
from modelopt.run.journal import write_json_atomic
from modelopt.run.layout import BEST_PLAN, SUMMARY
from modelopt.run.reported import CurvePoint, reported_plans
from modelopt.run.summary import RunSummary, summarize

__all__ = ["Ending", "RunResult", "finish"]


@dataclass(frozen=True)
class RunResult:
    """What a finished run found.

    `best` is the smallest plan confirmed on the confirm split (the search's best, unconfirmed,
    when the data have no confirm split); `best_test` its held-out test metrics, the headline;
    `pareto` pairs each front trial (by the val retention bound) with its test metrics. Each reported plan's
    figures are its record in `summary` (`summary.best`, ...: `modelopt.run.reported`), selected from here.
    """

    run_dir: Path
    trials: tuple[Trial, ...]
    best: Trial | None
    best_test: Metrics | None
    pareto: tuple[tuple[Trial, Metrics | None], ...]
    budget_used: float
    summary: RunSummary
    best_confirm: Metrics | None = None  # the best plan's metrics on the confirm split
    search_best: Trial | None = None  # the search's pick on val (a search-time estimate)
    confirmation: Confirmation | None = None
    # What the run may claim, whole (`modelopt.certify.certify`): the record the summary, the CLI table and the
    # reports select their figures from; None for a result read back from a run folder.
    certificate: Certificate | None = None
    stopped: bool = False  # the search was stopped by Ctrl-C: the plans certified are the trials' so far

    @property
    def curve(self) -> tuple[CurvePoint, ...]:
        """The certified curve (`--floors`): per floor, highest first, the smallest plan certified there with its
        test figures, and the uniform plans certified at it; empty for a one-floor run."""
        return self.summary.curve



@dataclass(frozen=True)
class Ending:
    """What the end of a run reads from its loop."""

    evaluator: Evaluator
    objective: Objective
    config: RunConfig
    run_dir: Path
    budget: float
    spent: float
    eval_seconds: float
    latency: PlanLatency | None
    console: Console | None  # where reconstruction reports its progress (None: quiet)
    with_latency: Callable[[Metrics, Plan | Realised], Metrics]  # metrics with the plan's latency, as the loop adds it
    max_claims: int | None = None  # claims confirmation may test in the run's time left (None: no time budget)
    refit: bool = True  # False: the run's time left does not cover refitting its finalists (confirmed as composed)
    stopped: bool = False  # Ctrl-C stopped the search before its budget (summary.json says so)


def finish(end: Ending, trials: list[Trial], search_wall: float) -> RunResult:
    """The run's trials certified, its reported plans timed (with an engine), its summary written."""
    ev, latency = end.evaluator, end.latency
    refit = None
    if end.config.reconstruct and end.refit:
        refit = Refits(ev, end.run_dir, progress=None if end.console is None else end.console.print)
    elif end.config.reconstruct and end.console is not None:
        end.console.print("Time: too little left to refit the finalists; they are confirmed as composed",
                          highlight=False)
    cert = certify(ev, end.objective, trials, latency, refit=refit, max_claims=end.max_claims)
    assert cert.test is not None  # certify scores test unless told not to
    test_metrics = dict(cert.test)
    if latency is not None:  # measured once per distinct plan, for the final set only
        latency.retime([cert.realise(ev, t.plan) for t in cert.reported.values()])
        test_metrics = {key: end.with_latency(m, cert.realise(ev, cert.reported[key].plan))
                        for key, m in test_metrics.items()}
    plans = reported_plans(cert, end.objective, ev.space, test_metrics)  # the one record tables select from
    if cert.best is not None:
        ev.space.save_plan(cert.best.plan, end.run_dir / BEST_PLAN)
    float_latency = {}
    if latency is not None:  # the float model in the engine's default precision first, then the others
        float_latency = {latency.name: latency.reference().median_ms,
                         **{k: v.median_ms for k, v in latency.float_references().items()}}
    summary = summarize(
        evaluator=ev, objective=end.objective, config=end.config, run_dir=end.run_dir, budget=end.budget,
        trials=trials, certificate=cert, plans=plans, search_wall=search_wall, eval_seconds=end.eval_seconds,
        float_latency=float_latency,
        exits=None if cert.best is None else exit_pattern(ev, cert.realise(ev, cert.best.plan)), stopped=end.stopped)
    write_json_atomic(end.run_dir / SUMMARY, summary.to_json())
    best = plans.best  # RunResult's metrics are selected from the records
    test, conf = (None, None) if best is None else (best.metrics_on(Split.TEST), best.metrics_on(Split.CONFIRM))
    return RunResult(end.run_dir, tuple(trials), cert.best, test,
                     tuple((t, e.metrics_on(Split.TEST)) for t, e in zip(cert.front, plans.pareto, strict=True)),
                     end.spent, summary, conf, cert.search_best, cert.confirmation, cert, stopped=end.stopped)

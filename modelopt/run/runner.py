"""The budgeted search loop: ask, evaluate, journal, tell; resume; final re-score on test."""

from __future__ import annotations

import dataclasses
import functools
import gc
import json
import math
import os
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from modelopt._version import __version__
from modelopt.errors import ConfigError, ModeloptError
from modelopt.evaluator import Evaluator, Metrics
from modelopt.fidelity import Fidelity
from modelopt.latency.plan import PlanLatency
from modelopt.objective import Objective, Target, best_of
from modelopt.plan import Plan
from modelopt.run.confirm import Confirmation, check_certifiable, confirm, finalists
from modelopt.run.journal import Journal, write_json_atomic
from modelopt.run.layout import BEST_PLAN, CONFIG, JOURNAL, STATE, STATE_NEXT, SUMMARY
from modelopt.run.lock import lock_run_folder
from modelopt.search._base import Strategy
from modelopt.trial import Trial, TrialStatus

if TYPE_CHECKING:  # the config imports this package (run.confirm): its type only, no import at run time
    from modelopt.config import RunConfig

MAX_IDLE_ASKS = 2000  # consecutive already-seen plans before the space counts as exhausted


@dataclass(frozen=True)
class RunResult:
    """What a finished run found.

    `best` is the smallest plan confirmed on the confirm split (the search's best, unconfirmed,
    when the data have no confirm split); `best_test` its held-out test metrics, the headline;
    `pareto` pairs each front trial (by the val retention bound) with its test metrics.
    """

    run_dir: Path
    trials: tuple[Trial, ...]
    best: Trial | None
    best_test: Metrics | None
    pareto: tuple[tuple[Trial, Metrics | None], ...]
    budget_used: float
    summary: dict[str, Any]
    best_confirm: Metrics | None = None  # the best plan's metrics on the confirm split
    search_best: Trial | None = None  # the search's pick on val (a search-time estimate)
    confirmation: Confirmation | None = None


class Runner:
    """Drives one strategy against one evaluator for `budget` full-evaluation equivalents.

    Args:
        evaluator: scores plans.
        strategy: proposes plans.
        objective: turns metrics into rewards and decides feasibility.
        budget: full-evaluation equivalents to spend.
        run_dir: where the journal, state, best plan and summary go.
        config: the run's settings (resolved), saved to run.json and checked on resume.
        resume: continue the journal already in `run_dir`.
        progress: show a progress bar.
        fidelity: multi-fidelity scoring (stop plans early on a subset of val); None scores every
            plan on the whole val split.
        latency: measures plan latency: for every plan when latency is the objective, else for
            the best plan and the Pareto front at the end; None measures none (unless the
            objective needs it, then a default torch measurement).
    """

    def __init__(
        self,
        evaluator: Evaluator,
        strategy: Strategy,
        objective: Objective,
        *,
        budget: float,
        run_dir: str | Path,
        config: RunConfig,
        resume: bool = False,
        progress: bool = True,
        console: Console | None = None,
        fidelity: Fidelity | None = None,
        latency: PlanLatency | None = None,
    ) -> None:
        if not 0 < budget < math.inf:
            raise ConfigError(f"budget must be a positive number, got {budget!r}")
        self.evaluator, self.strategy, self.objective = evaluator, strategy, objective
        self.space = evaluator.space
        self.budget = float(budget)
        self.run_dir = Path(run_dir)
        self.config = config
        self.resume = resume
        self.progress = progress
        self.fidelity = fidelity
        if latency is None and objective.target is Target.LATENCY:
            latency = PlanLatency(evaluator)
        self.latency = latency
        self.console = console or Console(stderr=True)
        self.journal = Journal(self.run_dir / JOURNAL)
        self.trials: list[Trial] = []
        self.eval_seconds = 0.0
        check_certifiable(evaluator, objective, self.console)

    # ---- set-up and resume ----------------------------------------------------------------

    def _open(self) -> None:
        if self.run_dir.exists() and not self.run_dir.is_dir():
            raise ConfigError(f"run folder {str(self.run_dir)!r} is a file; pass a folder to --out")
        self._lock = lock_run_folder(self.run_dir)  # held while this runner lives: one writer per folder
        self.run_dir.mkdir(parents=True, exist_ok=True)
        cfg_path = self.run_dir / CONFIG
        if self.journal.exists() or cfg_path.exists():
            if not self.resume:
                n = len(self.journal.read())
                raise ConfigError(
                    f"run folder {str(self.run_dir)!r} already holds a run ({n} trials); "
                    "pass --resume to continue it, or another --out"
                )
            self._check_same_run(cfg_path)
            self.trials = [Trial.from_json(r, self.space) for r in self.journal.read()]
            for trial in self.trials:  # what the killed process charged once is not charged again
                self.evaluator.mark_paid(trial.plan)
            self._restore_strategy()
        write_json_atomic(cfg_path, {**self.config.to_json(), "budget": self.budget})

    def _check_same_run(self, cfg_path: Path) -> None:
        if cfg_path.exists():
            self.config.check_resumes(self.run_dir)

    def _restore_strategy(self) -> None:
        told = 0
        # The next state first: a kill after a trial's journal line left it for exactly that trial.
        for name, fits in ((STATE_NEXT, len(self.trials).__eq__), (STATE, len(self.trials).__ge__)):
            path = self.run_dir / name
            state = json.loads(path.read_text()) if path.exists() else None
            if state is not None and fits(state.get("n_trials", 0)):
                self.strategy.load_state_dict(state["strategy"])
                told = state["n_trials"]
                break
        for trial in self.trials[told:]:
            self.strategy.tell(trial)

    # ---- the loop -------------------------------------------------------------------------

    @property
    def spent(self) -> float:
        return sum(t.cost for t in self.trials)

    def _target_value(self, plan: Plan) -> float:
        """The objective's target for `plan`, known before scoring it (sizes and bitops are static)."""
        target = self.objective.target
        if target is Target.SIZE:
            return float(self.evaluator.size_bytes(plan))
        if target is Target.BITOPS:
            return float(self.evaluator.bitops(plan))
        if target is Target.LATENCY:
            return -math.inf  # only known once measured: never skipped as unable to improve
        return float(self.evaluator.macs(plan))

    def _cannot_improve(self, plan: Plan) -> bool:
        """True when `plan` cannot beat the best feasible plan so far, whatever its accuracy."""
        feasible = [self.objective.value(t.metrics) for t in self.trials if t.feasible and t.metrics is not None]
        return bool(feasible) and self._target_value(plan) > min(feasible)

    def _evaluate(self, plan: Plan) -> Trial:
        t0 = time.perf_counter()
        cost = self.evaluator.cost("val")  # a failed trial is charged in full
        trial = functools.partial(Trial, number=len(self.trials), plan=plan, strategy=self.strategy.name,
                                  seed=self.strategy.seed, version=__version__)
        failed: Trial | None = None
        out_of_memory = False
        try:
            if self.fidelity is None:
                metrics = self.evaluator.evaluate(plan, split="val")
            else:
                finish = not (self.fidelity.dominated and self._cannot_improve(plan))
                metrics = self.evaluator.evaluate_staged(plan, self.objective.min_retention, self.fidelity,
                                                         finish=finish, confidence=self.objective.confidence,
                                                         count_gains=self.objective.count_gains)
            cost = self.evaluator.trial_cost(metrics)  # images scored + any preparation (BN re-estimation)
            if self.objective.target is Target.LATENCY and metrics.stopped is None:
                metrics = self._with_latency(metrics, plan)
            reward = self.objective.reward(metrics)
            if math.isnan(metrics.retention) or not math.isfinite(reward):
                raise ModeloptError(f"plan {plan.key} gives a non-finite score")
        except Exception as exc:  # noqa: BLE001 -- a crashing plan is recorded as failed; the search goes on
            msg = f"{type(exc).__name__}: {exc}" if not isinstance(exc, ModeloptError) else str(exc)
            if not isinstance(exc, ModeloptError):
                msg += " | " + traceback.format_exc(limit=3).strip().splitlines()[-1]
            failed = trial(status=TrialStatus.FAILED, metrics=None, reward=None, feasible=False, cost=cost,
                           seconds=time.perf_counter() - t0, error=msg)
            out_of_memory = isinstance(exc, torch.cuda.OutOfMemoryError)
        finally:
            self.eval_seconds += time.perf_counter() - t0
        if failed is not None:
            if out_of_memory:  # here, past the except clause: its traceback no longer holds the trial's tensors
                free_cuda_memory()
            return failed
        return trial(status=TrialStatus.COMPLETE, metrics=metrics, reward=reward, cost=cost,
                     feasible=self.objective.feasible(metrics), seconds=time.perf_counter() - t0)

    def _with_latency(self, metrics: Metrics, plan: Plan) -> Metrics:
        assert self.latency is not None
        return dataclasses.replace(metrics, latency_ms=self.latency.measure(plan).median_ms,
                                   latency_backend=self.latency.name,
                                   float_latency_ms=self.latency.reference().median_ms)

    def _record(self, trial: Trial) -> None:
        self.trials.append(trial)
        self.strategy.tell(trial)
        # The state after this trial is written before its journal line and moved into place after it,
        # so a kill between the two leaves the state that matches the journal: replaying `tell` on an
        # older state would skip what `ask` changed, and the resumed search would propose other plans.
        # Not fsynced: after a power cut an older state plus the journal's later trials rebuild it.
        state = {"n_trials": len(self.trials), "strategy": self.strategy.state_dict()}
        write_json_atomic(self.run_dir / STATE_NEXT, state, durable=False)
        self.journal.append(trial.to_json())
        os.replace(self.run_dir / STATE_NEXT, self.run_dir / STATE)

    def _best_text(self) -> str:
        best = best_of([t for t in self.trials if t.ok], lambda t: t.scored, self.objective)
        if best is None:
            return "no feasible plan yet"
        m = best.scored
        return f"best {m.compression:.2f}x size at {m.retention:.2%} retention (trial {best.number})"

    def run(self) -> RunResult:
        """Runs the search to its budget, then re-scores the best and Pareto plans on test."""
        try:
            return self._run()
        finally:  # the folder is free again however the run ends, even if this runner lives on
            if getattr(self, "_lock", None) is not None:
                self._lock.release()

    def _run(self) -> RunResult:
        t_start = time.perf_counter()
        self._open()
        seen = {t.plan.key: t for t in self.trials}
        idle = 0
        # Progress is budget spent (full val evaluations), which multi-fidelity makes differ from trials.
        columns = (TextColumn("[bold]{task.description}"), BarColumn(),
                   TextColumn("{task.completed:.1f}/{task.total:g} evals, {task.fields[trials]} trials"),
                   TimeElapsedColumn(), TextColumn("{task.fields[best]}"))
        with Progress(*columns, console=self.console, disable=not self.progress, transient=False) as bar:
            task = bar.add_task(f"{self.strategy.name} search", total=self.budget, best=self._best_text(),
                                trials=len(self.trials))
            bar.update(task, completed=self.spent)  # budget is fractional: update takes a float
            if not self.trials and self.objective.confidence > 0 and len(self.space):
                # Trial 0 is the anchor, the safest compressed plan (modelopt.space.SearchSpace.anchor):
                # under a confidence bound few plans can be certified, and this one usually can; every
                # strategy is told it like its own trials, and confirmation has a safe plan to fall back on.
                trial = self._evaluate(self.space.anchor())
                self._record(trial)
                seen[trial.plan.key] = trial
                bar.update(task, completed=self.spent, best=self._best_text(), trials=len(self.trials))
            while self.spent < self.budget - 1e-9:
                plan = self.strategy.ask(1)[0]
                if plan.key in seen:
                    # Never pay twice for a plan: tell the strategy what it already scored.
                    self.strategy.tell(seen[plan.key])
                    idle += 1
                    if idle >= MAX_IDLE_ASKS:
                        self.console.print("[yellow]search space exhausted: the strategy only proposes seen plans")
                        break
                    continue
                idle = 0
                trial = self._evaluate(plan)
                self._record(trial)
                seen[plan.key] = trial
                bar.update(task, completed=self.spent, best=self._best_text(), trials=len(self.trials))
        search_wall = time.perf_counter() - t_start
        return self._finish(search_wall)

    # ---- the end: re-score on test, write the run folder ----------------------------------

    def _finish(self, search_wall: float) -> RunResult:
        final = finalists(self.trials, self.objective)
        search_best, front = final.search_best, list(final.front)
        confirmation = confirm(self.evaluator, self.objective, list(final.candidates))
        # With a confirm split the reported best is the smallest plan it confirmed; without one (or
        # with one too small to certify the floor), the search's best on the val bound, unconfirmed.
        best = confirmation.best if confirmation.usable else search_best
        to_score = {t.plan.key: t for t in ([best] if best else []) + ([search_best] if search_best else []) + front}
        test_metrics = {key: self.evaluator.evaluate(t.plan, split="test") for key, t in to_score.items()}
        if self.latency is not None:  # measured once per distinct plan, for the final set only
            test_metrics = {key: self._with_latency(m, to_score[key].plan) for key, m in test_metrics.items()}
        best_test = test_metrics.get(best.plan.key) if best else None
        pareto = tuple((t, test_metrics.get(t.plan.key)) for t in front)
        if best is not None:
            self.space.save_plan(best.plan, self.run_dir / BEST_PLAN)
        summary = self._summary(best, search_best, confirmation, test_metrics, pareto, search_wall)
        write_json_atomic(self.run_dir / SUMMARY, summary)
        confirmed = {t.plan.key: m for t, m in confirmation.finalists}
        return RunResult(self.run_dir, tuple(self.trials), best, best_test, pareto, self.spent, summary,
                         best_confirm=confirmed.get(best.plan.key) if best else None, search_best=search_best,
                         confirmation=confirmation)

    def _summary(
        self, best: Trial | None, search_best: Trial | None, confirmation: Confirmation,
        test: dict[str, Metrics], pareto: tuple[tuple[Trial, Metrics | None], ...], search_wall: float,
    ) -> dict[str, Any]:
        wl = self.evaluator.workload
        confirmed = {t.plan.key: m for t, m in confirmation.finalists}
        conf = self.objective.confidence

        def metrics(m: Metrics | None) -> dict[str, Any] | None:
            if m is None:
                return None
            lo, hi = m.retention_bounds(conf)
            return {**m.to_dict(), "retention_lower": lo, "retention_upper": hi,
                    "retention_certified": self.objective.retention_lower(m)}

        def entry(t: Trial) -> dict[str, Any]:
            return {"trial": t.number, "plan_key": t.plan.key, "plan": self.space.dump_plan(t.plan),
                    "test": metrics(test.get(t.plan.key)), "confirm": metrics(confirmed.get(t.plan.key)),
                    "val": metrics(t.metrics)}

        splits = ("val", "confirm", "test") if "confirm" in wl.splits else ("val", "test")
        return {
            "version": __version__,
            "run_dir": str(self.run_dir),
            "config": self.config.to_json(),
            "objective": {"target": self.objective.target.value, "min_retention": self.objective.min_retention,
                          "confidence": conf, "count_gains": self.objective.count_gains},
            "budget": self.budget,
            "budget_used": self.spent,
            "n_trials": len(self.trials),
            "n_failed": sum(not t.ok for t in self.trials),
            "n_feasible": sum(t.feasible for t in self.trials),
            "baseline": {s: {"accuracy": wl.baseline_accuracy(s), "n_samples": len(wl.split(s))} for s in splits},
            "float_size_bytes": wl.float_size_bytes,
            "device": str(wl.device),
            # The reported best: confirmed on images that did not select it (when the data have a
            # confirm split); `search_best` is the search's own pick on val, a search-time estimate.
            "best": None if best is None else {**entry(best), "confirmed": confirmation.usable},
            "search_best": None if search_best is None else entry(search_best),
            "confirmation": {
                "split": confirmation.split,
                "usable": confirmation.usable,
                "ceiling": confirmation.ceiling,
                "confirmed": confirmation.confirmed,
                "finalists": [{"trial": t.number, "plan_key": t.plan.key, "confirmed": i < confirmation.confirmed,
                               "confirm": metrics(m)} for i, (t, m) in enumerate(confirmation.finalists)],
            },
            "pareto": [entry(t) for t, _ in pareto],
            # One-time work: wall seconds in this process, and the budget units charged for it.
            "preparation": {"seconds": dict(self.evaluator.one_time.seconds),
                            "charged": dict(self.evaluator.one_time.charged)},
            "search_wall_seconds": search_wall,
            "eval_seconds_this_session": self.eval_seconds,
        }


def free_cuda_memory() -> None:
    """Frees what a trial that ran out of CUDA memory left behind, so the next plan does not meet a full
    or fragmented pool: collects the failed trial's unreachable tensors, then hands the caching
    allocator's unused blocks back to the device. A no-op where CUDA was never initialised."""
    gc.collect()
    torch.cuda.empty_cache()

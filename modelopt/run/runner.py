"""The budgeted search loop: ask, evaluate, journal, tell; resume; final re-score on test."""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console

from modelopt._version import __version__
from modelopt.certify.evidence import evidence_lines
from modelopt.config.run_config import RunConfig
from modelopt.data.split import Split
from modelopt.errors import ConfigError, ModeloptError
from modelopt.evaluation.evaluator import Evaluator, Metrics, Realised
from modelopt.evaluation.fidelity import Fidelity
from modelopt.evaluation.trial import Trial, TrialStatus
from modelopt.executors import Executor, Job, LocalExecutor, Scored
from modelopt.executors.scoring import failure_text, free_cuda_memory
from modelopt.latency.plan import PlanLatency
from modelopt.objective import Objective, Target
from modelopt.plan.plan import Plan
from modelopt.run.clock import RunClock
from modelopt.run.console import progress_console, search_progress
from modelopt.run.finish import Ending, RunResult, finish
from modelopt.run.improve import best_text, cannot_improve
from modelopt.run.interrupt import StopRequest
from modelopt.run.journal import Journal, Record, write_json_atomic
from modelopt.run.layout import CONFIG, JOURNAL, STATE, STATE_NEXT
from modelopt.run.lock import RunLock, lock_run_folder
from modelopt.run.resume import restore_strategy
from modelopt.run.time_plan import TimePlan
from modelopt.search import Strategy

__all__ = ["MAX_IDLE_ASKS", "RunResult", "Runner", "free_cuda_memory"]

MAX_IDLE_ASKS = 2000  # consecutive already-seen plans before the space counts as exhausted
CLAIMS_ON_STOP = 2  # claims of the search's a run stopped by Ctrl-C certifies, beside the gate's two anchors
REFIT_EVERY = 10  # latency measurements between refits of the strategies' latency priors


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
        executor: scores the plans (`modelopt.executors`); None: this process, one plan at a time.
            With `executor.slots` > 1 the strategy is asked for that many plans ahead (`ask` with
            virtual loss or a constant liar), and trials are recorded in the order they were asked.
        evidence: the lines saying what the splits can certify (`modelopt.certify.evidence.evidence_lines`, as
            `build` found them); None: found here.
        clock: the run's time budget (`RunClock`): the search stops while the end still fits (`modelopt.run.time_plan`).
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
        executor: Executor | None = None,
        lock: RunLock | None = None,
        evidence: tuple[str, ...] | None = None,
        clock: RunClock | None = None,
    ) -> None:
        self.time = TimePlan(clock or RunClock(), evaluator, config.reconstruct)
        if not 0 < budget < math.inf and not (budget == math.inf and self.time.clock.timed):  # timed: may be open
            raise ConfigError(f"budget must be a positive number, got {budget!r}")
        # The search's trials are judged at the curve's lowest floor (`Objective.search`); the run certifies the whole
        # curve at its end (`finish`).
        self.evaluator, self.strategy, self.objective = evaluator, strategy, objective.search
        self.certified = objective
        self.space = evaluator.space
        self.budget = float(budget)
        self.run_dir = Path(run_dir)
        self.config = config
        self.resume, self.progress, self.fidelity = resume, progress, fidelity
        if latency is None and objective.target is Target.LATENCY:
            latency = PlanLatency(evaluator)
        self.latency = latency
        self.executor = executor or LocalExecutor(evaluator, objective, fidelity)
        self._given_lock = lock
        self._stop = StopRequest(lambda: self.console.print(
            "[yellow]Ctrl-C[/]: the search stops after this trial and the run certifies the best plan so far "
            "(Ctrl-C again to stop at once; --resume continues the search)"))
        self._reissue: list[Plan] = []  # plans in flight when the run last stopped: asked again first
        self.console = console or progress_console()
        self.journal = Journal(self.run_dir / JOURNAL)
        self.trials: list[Trial] = []
        self.eval_seconds = 0.0
        # What the splits can certify, as `build` found it (a runner built by hand finds it here).
        for line in evidence_lines(evaluator.workload, objective) if evidence is None else evidence:
            self.console.print(line, highlight=False, soft_wrap=True)

    # ---- set-up and resume ----------------------------------------------------------------

    def _open(self) -> None:
        if self.run_dir.exists() and not self.run_dir.is_dir():
            raise ConfigError(f"run folder {str(self.run_dir)!r} is a file; pass a folder to --out")
        # Held while this runner lives: one writer per folder (taken before loading by `modelopt.api.run`).
        given = self._given_lock
        self._lock = given if given is not None and given.held else lock_run_folder(self.run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        cfg_path = self.run_dir / CONFIG
        if self.journal.exists() or cfg_path.exists():
            if not self.resume:
                n = self.journal.check()
                raise ConfigError(
                    f"run folder {str(self.run_dir)!r} already holds a run ({n} trials); "
                    "pass --resume to continue it, or another --out"
                )
            self._check_same_run(cfg_path)
            self.trials = [record.trial(self.space) for record in self.journal.records()]
            for trial in self.trials:  # what the killed process charged once is not charged again
                self.evaluator.mark_paid(trial.plan)
            self._restore_strategy()
        budget = self.budget if self.budget < math.inf else None  # null: a timed run's open budget
        write_json_atomic(cfg_path, {**self.config.to_json(), "budget": budget})

    def _check_same_run(self, cfg_path: Path) -> None:
        if cfg_path.exists():
            self.config.check_resumes(self.run_dir)

    def _restore_strategy(self) -> None:
        state = restore_strategy(self.run_dir, self.strategy, self.trials)
        # The plans it had asked for and not yet recorded: the resumed loop scores them first, instead of asking
        # again (the restored strategy still awaits them); what the run paid and how long it took so far.
        recorded = {t.plan.key for t in self.trials}
        self._reissue = [p for flat in state.get("in_flight", []) if (p := self.space.plan_from_flat(flat)).key
                         not in recorded]
        self.evaluator.one_time.restore(state.get("preparation") or {})
        took = state.get("time") or {}
        self.time.clock = self.time.clock.resumed(took.get("limit"), float(took.get("elapsed") or 0.0))

    # ---- the loop -------------------------------------------------------------------------

    @property
    def spent(self) -> float:
        return sum(t.cost for t in self.trials)

    def _trial(self, job: Job, scored: Scored) -> Trial:
        """The trial of a scored job, charged and judged by this run (a failed one is charged in full)."""
        t0 = time.perf_counter()
        trial = functools.partial(Trial, number=len(self.trials), plan=job.plan, strategy=self.strategy.name,
                                  seed=self.strategy.seed, version=__version__)
        cost, error = self.evaluator.scorer.cost(Split.VAL), scored.error
        if scored.metrics is not None:
            try:
                metrics = scored.metrics
                if scored.charges is not None:  # scored by a worker: its preparations are charged here, once
                    metrics = self.evaluator.scorer.settle(metrics, scored.charges)
                cost = self.evaluator.scorer.trial_cost(metrics)  # images scored + any preparation (BN re-estimation)
                if self.objective.target is Target.LATENCY and metrics.stopped is None:
                    metrics = self._with_latency(metrics, job.plan)
                reward = self.objective.reward(metrics)
                if math.isnan(metrics.retention) or not math.isfinite(reward):
                    raise ModeloptError(f"plan {job.plan.key} gives a non-finite score")
            except Exception as exc:  # noqa: BLE001 -- a crashing plan is recorded as failed; the search goes on
                error = failure_text(exc)
        seconds = scored.seconds + time.perf_counter() - t0
        self.eval_seconds += seconds
        if error is not None or scored.metrics is None:
            return trial(status=TrialStatus.FAILED, metrics=None, reward=None, feasible=False, cost=cost,
                         seconds=seconds, error=error)
        return trial(status=TrialStatus.COMPLETE, metrics=metrics, reward=reward, cost=cost,
                     feasible=self.objective.feasible(metrics), seconds=seconds)

    def _with_latency(self, metrics: Metrics, plan: Plan | Realised) -> Metrics:
        assert self.latency is not None
        out = dataclasses.replace(metrics, latency_ms=self.latency.measure(plan).median_ms,
                                  latency_backend=self.latency.name,
                                  float_latency_ms=self.latency.reference().median_ms)
        if self.objective.target is Target.LATENCY and len(self.latency.model.ms) % REFIT_EVERY == 0:
            self.latency.model.apply()  # the latency model refitted on the trials measured so far
            self.strategy.costs_changed()
        return out

    def _record(self, trial: Trial, in_flight: tuple[Plan, ...] = ()) -> None:
        self.trials.append(trial)
        self.strategy.tell(trial)
        # The state after this trial is written before its journal line and moved into place after it,
        # so a kill between the two leaves the state that matches the journal: replaying `tell` on an
        # older state would skip what `ask` changed, and the resumed search would propose other plans.
        # Not fsynced: after a power cut an older state plus the journal's later trials rebuild it.
        # The plans asked and not yet recorded go with it: a resumed run scores them before asking anew.
        state = {"n_trials": len(self.trials), "strategy": self.strategy.state_dict(),
                 "in_flight": [plan.to_flat() for plan in in_flight], "preparation": self.evaluator.one_time.to_json(),
                 "time": {"limit": self.time.clock.limit, "elapsed": self.time.clock.elapsed()}}
        write_json_atomic(self.run_dir / STATE_NEXT, state, durable=False)
        self.journal.append(Record.of(trial))
        os.replace(self.run_dir / STATE_NEXT, self.run_dir / STATE)

    def _must_stop(self) -> bool:
        """Whether Ctrl-C asked to stop, or the time left no longer covers another trial and the end (said once)."""
        if self._stop.requested:
            return True
        if (stop := self.time.stop_line(self.trials)) is not None:
            self.console.print(stop, highlight=False)
        return stop is not None

    def run(self) -> RunResult:
        """Runs the search to its budget, then re-scores the best and Pareto plans on test."""
        try:
            return self._run()
        finally:  # the folder and the workers are free again however the run ends, even if this runner lives on
            self.executor.close()
            for lock in (getattr(self, "_lock", None), self._given_lock):
                if lock is not None:
                    lock.release()

    def _run(self) -> RunResult:
        t_start = time.perf_counter()
        self._open()
        seen = {t.plan.key: t for t in self.trials}
        bounded, timed = self.budget < math.inf, self.time.clock.timed
        with search_progress(self.console, self.progress, timed=timed, bounded=bounded) as bar:
            def fields() -> dict[str, Any]:
                return {"best": best_text(self.trials, self.objective), "trials": len(self.trials),
                        "left": self.time.left_text()}

            task = bar.add_task(f"{self.strategy.name} search", total=self.budget if bounded else None, **fields())

            def update() -> None:  # budget is fractional: update takes a float
                bar.update(task, completed=self.spent, **fields())

            update()

            with self._stop:  # Ctrl-C: the search stops after the trial in progress, the run certifies what it has
                self._score_anchors(seen, update)
                if (said := self.time.announce(self.trials)) is not None:
                    bar.console.print(said, highlight=False, soft_wrap=True)
                self._search(seen, update)
        self.executor.close()  # the workers' memory is free before the final re-scoring
        claims = self.time.claims_affordable(self.trials)
        if self._stop.requested:
            claims = min(claims or CLAIMS_ON_STOP, CLAIMS_ON_STOP)
        end = Ending(self.evaluator, self.certified, self.config, self.run_dir, self.budget, self.spent,
                     self.eval_seconds, self.latency, self.console if self.progress else None, self._with_latency,
                     claims, self.time.refit_affordable(self.trials), stopped=self._stop.requested)
        return finish(end, self.trials, time.perf_counter() - t_start)  # certify, time, write (`run.finish`)

    def _score_anchors(self, seen: dict[str, Trial], update: Callable[[], None]) -> None:
        """The first trials are the anchors (`SearchSpace.anchors`: uniform INT8, INT4, INT3), scored
        before any strategy asks: the no-search answers the search must beat, told to every strategy like
        its own trials, and the plans confirmation tests first. A run resumed before they were all
        scored scores the rest; a run whose search had begun (or under point estimates) scores none."""
        anchors = self.objective.anchors(self.space) if self.objective.confidence > 0 else ()
        keys = {plan.key for plan in anchors}
        if any(t.plan.key not in keys for t in self.trials):
            return
        for plan in anchors:
            if plan.key in seen or self.spent >= self.budget - 1e-9:
                continue  # (a Ctrl-C waits for them: they are what a stopped run certifies)
            job = Job(len(self.trials), plan)
            self.executor.submit(job)
            trial = self._trial(job, self._scored(job, {}))
            self._record(trial)
            seen[trial.plan.key] = trial
            update()

    def _search(self, seen: dict[str, Trial], update: Callable[[], None]) -> None:
        """Asks, scores and records until the budget is spent, with up to `executor.slots` plans in
        flight. Trials are recorded in the order their plans were asked, and the strategy is asked
        only after a record, so the trials do not depend on which worker finished first."""
        window: deque[tuple[Plan, Job | None]] = deque()  # asked, not yet recorded (None: a repeat in flight)
        done: dict[int, Scored] = {}
        seq, idle = len(self.trials), 0
        while True:
            while idle < MAX_IDLE_ASKS and (free := self._room(window)):
                reissued, self._reissue = self._reissue[:free], self._reissue[free:]
                for plan in reissued or self.strategy.ask(free):
                    if plan.key in seen:  # never pay twice for a plan: tell the strategy what it already scored
                        self.strategy.tell(seen[plan.key])
                        idle += 1
                    elif any(plan.key == p.key for p, _ in window):  # told the first one's trial once recorded
                        window.append((plan, None))
                        idle += 1
                    else:
                        idle = 0
                        asked = Job(seq, plan, finish=self._worth_finishing(plan))
                        seq += 1
                        self.executor.submit(asked)
                        window.append((plan, asked))
                if idle >= MAX_IDLE_ASKS:
                    self.console.print("[yellow]search space exhausted: the strategy only proposes seen plans")
            if self.spent >= self.budget - 1e-9 or self._must_stop() or not window:
                return  # what is still in flight was asked ahead and is not charged: the budget is spent
            plan, job = window.popleft()
            if job is None:
                self.strategy.tell(seen[plan.key])
                continue
            trial = self._trial(job, self._scored(job, done))
            self._record(trial, tuple(p for p, _ in window))
            seen[plan.key] = trial
            update()

    def _room(self, window: deque[tuple[Plan, Job | None]]) -> int:
        """How many more plans to ask for: free slots, while the budget left covers every plan in
        flight scored in full (one slot: the budget is not yet spent, as the serial loop asks)."""
        scoring = sum(job is not None for _, job in window)
        if self._stop.requested or not self.time.search_may_go_on(self.trials):
            return 0
        if self.spent + scoring * self.evaluator.scorer.cost(Split.VAL) >= self.budget - 1e-9:
            return 0
        return max(self.executor.slots - scoring, 0)

    def _scored(self, job: Job, done: dict[int, Scored]) -> Scored:
        """`job`'s result, waiting for the executor; results of later jobs wait in `done` for their turn."""
        while job.seq not in done:
            done.update((j.seq, scored) for j, scored in self.executor.wait())
        return done.pop(job.seq)

    def _worth_finishing(self, plan: Plan) -> bool:
        """Under multi-fidelity, whether to score `plan` to the end even once it cannot beat the best."""
        return self.fidelity is None or not (self.fidelity.dominated and cannot_improve(
            self.evaluator, self.objective, self.trials, plan))

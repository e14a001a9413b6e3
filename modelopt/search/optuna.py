"""Optuna baselines: TPE on the reward, NSGA-II on (retention, size), through Optuna's ask/tell.

Each decision is one categorical parameter named after the decision; its values
are indices into `decision.choices` (Optuna stores JSON primitives, not choices).
Optuna is an optional dependency (`pip install 'modelopt[optuna]'`), imported
when a strategy is built, so registering these names costs nothing without it.

An in-memory study cannot be pickled into a JSON state, so `state_dict` keeps
the study's trials as plain records and `load_state_dict` replays them into a
fresh study with `add_trial`. The sampler is rebuilt before every ask with a
seed derived from (strategy, seed, asks so far): a restored strategy, holding
the same trials, then draws exactly what the original would have.
"""

from __future__ import annotations

import hashlib
import math
import warnings
from typing import TYPE_CHECKING, Any, ClassVar

from modelopt.errors import ConfigError
from modelopt.evaluation.trial import Trial
from modelopt.objective import Objective
from modelopt.plan.plan import Plan
from modelopt.plan.space import SearchSpace
from modelopt.search._base import Strategy
from modelopt.search._registry import STRATEGIES

if TYPE_CHECKING:
    import optuna

STATE_VERSION = 1
VIOLATION_ATTR = "retention_violation"  # min_retention - retention bound; <= 0 is feasible


def _import_optuna() -> Any:
    try:
        import optuna
    except ImportError:
        raise ConfigError(
            "the optuna-tpe and optuna-nsga2 strategies need Optuna; install it with: pip install 'modelopt[optuna]'"
        ) from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # otherwise every tell logs a line at INFO
    return optuna


def _derived_seed(name: str, seed: int, n_asked: int) -> int:
    # Stable across processes and Python versions (hash() of a str is not). The name keeps TPE's
    # start-up trials and NSGA-II's first generation from being the same plans for the same seed.
    return int.from_bytes(hashlib.sha256(f"{name}/{seed}/{n_asked}".encode()).digest()[:4], "little") >> 1


def _constraints_from_attr(frozen_trial: optuna.trial.FrozenTrial) -> tuple[float]:
    """constraints_func for Optuna < 5, which has no Trial.set_constraint."""
    return (float(frozen_trial.user_attrs[VIOLATION_ATTR]),)


class _OptunaSearch(Strategy):
    """Shared ask/tell bookkeeping; subclasses choose directions, sampler and values."""

    directions: ClassVar[tuple[str, ...]]

    def __init__(self, space: SearchSpace, objective: Objective, *, seed: int = 0) -> None:
        super().__init__(space, objective, seed=seed)
        self._optuna = _import_optuna()
        # Optuna >= 5 records constraints on the trial; older versions compute them in the sampler.
        self._set_constraint = hasattr(self._optuna.trial.Trial, "set_constraint")
        cat = self._optuna.distributions.CategoricalDistribution
        self._dists = {d.name: cat(list(range(len(d.choices)))) for d in space.decisions}
        self._n_asked = 0
        # plan key -> optuna trials asked and not yet told, in ask order (a plan may be asked twice)
        self._pending: dict[str, list[optuna.trial.Trial]] = {}
        self._study = self._new_study()

    # ---- what subclasses define -----------------------------------------------------------

    def _sampler(self, seed: int) -> optuna.samplers.BaseSampler:
        raise NotImplementedError

    def _values(self, trial: Trial) -> list[float] | None:
        """The objective values of a trial, or None when Optuna should record it as failed."""
        raise NotImplementedError

    def _violation(self, trial: Trial) -> float | None:
        """min_retention - retention when the sampler uses constraints, else None."""
        return None

    # ---- ask / tell -----------------------------------------------------------------------

    def ask(self, n: int = 1) -> list[Plan]:
        plans = []
        for _ in range(n):
            self._study.sampler = self._sampler(_derived_seed(self.name, self.seed, self._n_asked))
            ot = self._study.ask()
            self._n_asked += 1
            picks = {d.name: d.choices[ot.suggest_categorical(d.name, list(range(len(d.choices))))]
                     for d in self.space.decisions}
            plan = self.space.plan(picks)
            self._pending.setdefault(plan.key, []).append(ot)
            plans.append(plan)
        return plans

    def tell(self, trial: Trial) -> None:
        queue = self._pending.get(trial.plan.key)
        if queue:
            ot = queue.pop(0)
            if not queue:
                del self._pending[trial.plan.key]
        else:
            # A plan this strategy never asked for (resume, warm start): enter it as if asked.
            ot = self._add_running(self._params(trial.plan))
            sampler = self._study.sampler
            ga_sampler = getattr(self._optuna.samplers, "BaseGASampler", None)  # Optuna >= 4
            if ga_sampler is not None and isinstance(sampler, ga_sampler):
                # A genetic sampler breeds only from trials it gave a generation; let it count this one.
                sampler.get_trial_generation(self._study, self._study.get_trials(deepcopy=False)[-1])
        values = self._values(trial)
        if values is None:
            self._study.tell(ot, state=self._optuna.trial.TrialState.FAIL)
            return
        violation = self._violation(trial)
        if violation is not None:
            ot.set_user_attr(VIOLATION_ATTR, violation)
            if self._set_constraint:
                ot.set_constraint("retention", violation)
        self._study.tell(ot, values)

    def _add_running(self, params: dict[str, int], **attrs: Any) -> optuna.trial.Trial:
        """A trial with fixed params added to the study as running, ready to be told."""
        optuna = self._optuna
        self._study.add_trial(optuna.trial.create_trial(
            state=optuna.trial.TrialState.RUNNING, params=params, distributions=self._dists, **attrs))
        return optuna.trial.Trial(self._study, self._study.get_trials(deepcopy=False)[-1]._trial_id)

    def _params(self, plan: Plan) -> dict[str, int]:
        params = {}
        for d in self.space.decisions:
            choice = plan.get(d.name)
            try:
                params[d.name] = d.choices.index(choice)
            except ValueError:
                raise ConfigError(
                    f"{self.name}: plan {plan.key} gives {d.name!r} the choice {choice!r}, which is not one of "
                    f"{list(d.choices)}; was it made for another search space?"
                ) from None
        return params

    def _new_study(self) -> optuna.Study:
        return self._optuna.create_study(directions=list(self.directions),
                                         sampler=self._sampler(_derived_seed(self.name, self.seed, self._n_asked)))

    # ---- state ----------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        trials = [
            {
                "state": t.state.name,
                "params": t.params,
                "values": t.values,
                "user_attrs": t.user_attrs,
                "system_attrs": t.system_attrs,
            }
            for t in self._study.get_trials(deepcopy=False)
        ]
        return {
            "version": STATE_VERSION,
            "strategy": self.name,
            "seed": self.seed,
            "n_asked": self._n_asked,
            "trials": trials,
            # NSGA-II caches each generation's parents here; keeping them makes a restore exact
            # even when trials of the previous generation finished after the cache was filled.
            "study_attrs": self._study._storage.get_study_system_attrs(self._study._study_id),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("version") != STATE_VERSION or state.get("strategy") != self.name:
            raise ConfigError(
                f"cannot restore {self.name} from a state of {state.get('strategy')!r} "
                f"version {state.get('version')!r}; expected {self.name!r} version {STATE_VERSION}"
            )
        optuna = self._optuna
        self.seed = int(state["seed"])
        self._n_asked = int(state["n_asked"])
        self._pending = {}
        self._study = self._new_study()
        for rec in state["trials"]:
            st = optuna.trial.TrialState[rec["state"]]
            attrs = {"user_attrs": rec["user_attrs"], "system_attrs": rec["system_attrs"]}
            if st == optuna.trial.TrialState.RUNNING:  # asked before the save, to be told after the restore
                ot = self._add_running(rec["params"], **attrs)
                plan = self.space.plan({d.name: d.choices[rec["params"][d.name]] for d in self.space.decisions})
                self._pending.setdefault(plan.key, []).append(ot)
                continue
            values = rec["values"] if st == optuna.trial.TrialState.COMPLETE else None
            self._study.add_trial(optuna.trial.create_trial(
                state=st, params=rec["params"], distributions=self._dists, values=values, **attrs))
        storage, study_id = self._study._storage, self._study._study_id
        for key, value in state.get("study_attrs", {}).items():
            storage.set_study_system_attr(study_id, key, value)


@STRATEGIES.register("optuna-tpe")
class OptunaTPE(_OptunaSearch):
    """Optuna's TPE sampler maximising the reward (infeasible plans already score below feasible ones).

    Args:
        space: the decisions and their choices.
        objective: turns metrics into the reward TPE maximises.
        seed: seeds every sampler draw.
        n_startup_trials: random trials before TPE starts modelling.

    Example:
        >>> OptunaTPE(space, Objective("size", min_retention=0.99), seed=0).ask(1)
    """

    name = "optuna-tpe"
    directions = ("maximize",)

    def __init__(self, space: SearchSpace, objective: Objective, *, seed: int = 0, n_startup_trials: int = 10) -> None:
        self.n_startup_trials = n_startup_trials
        super().__init__(space, objective, seed=seed)

    def _sampler(self, seed: int) -> optuna.samplers.BaseSampler:
        # A constant liar: plans asked and not yet told (in flight on other workers) count as bad results,
        # so a batch of asks spreads out instead of repeating one guess. With one plan at a time none is.
        with warnings.catch_warnings():  # experimental before Optuna 4
            warnings.simplefilter("ignore", self._optuna.exceptions.ExperimentalWarning)
            return self._optuna.samplers.TPESampler(seed=seed, n_startup_trials=self.n_startup_trials,
                                                    constant_liar=True)

    def _values(self, trial: Trial) -> list[float] | None:
        if trial.reward is None or math.isnan(trial.reward):
            return None
        return [float(trial.reward)]


@STRATEGIES.register("optuna-nsga2")
class OptunaNSGA2(_OptunaSearch):
    """Optuna's NSGA-II over (retention up, objective value down), with retention below the floor a constraint.

    Infeasible plans are dominated by every feasible one (constrained domination),
    so the population drifts toward the Pareto front above the retention floor.

    Args:
        space: the decisions and their choices.
        objective: the target to minimise and the retention floor.
        seed: seeds every sampler draw.
        population_size: plans per generation (smaller than Optuna's 50: our budgets are a few hundred trials).

    Example:
        >>> OptunaNSGA2(space, Objective("size", min_retention=0.99), seed=0, population_size=20).ask(1)
    """

    name = "optuna-nsga2"
    directions = ("maximize", "minimize")

    def __init__(self, space: SearchSpace, objective: Objective, *, seed: int = 0, population_size: int = 20) -> None:
        # Optuna's default of 50 leaves only three or four generations in a budget of 150-200 trials.
        self.population_size = population_size
        super().__init__(space, objective, seed=seed)

    def _sampler(self, seed: int) -> optuna.samplers.BaseSampler:
        samplers = self._optuna.samplers
        if self._set_constraint:
            return samplers.NSGAIISampler(seed=seed, population_size=self.population_size)
        with warnings.catch_warnings():  # constraints_func is marked experimental before Optuna 5
            warnings.simplefilter("ignore", self._optuna.exceptions.ExperimentalWarning)
            return samplers.NSGAIISampler(seed=seed, population_size=self.population_size,
                                          constraints_func=_constraints_from_attr)

    def _values(self, trial: Trial) -> list[float] | None:
        m = trial.metrics
        if trial.reward is None or m is None or math.isnan(m.retention):
            return None
        return [float(self.objective.retention_lower(m)), self.objective.value(m)]

    def _violation(self, trial: Trial) -> float | None:
        """The floor minus the retention bound at the objective's confidence (what feasibility uses)."""
        assert trial.metrics is not None
        return self.objective.min_retention - float(self.objective.retention_lower(trial.metrics))

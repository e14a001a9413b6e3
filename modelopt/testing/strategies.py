"""Conformance checks every registered search strategy must pass, plus synthetic objectives."""

from __future__ import annotations

import json
from collections.abc import Callable

from modelopt.data.split import Split
from modelopt.evaluation.metrics import Metrics
from modelopt.evaluation.trial import Trial, TrialStatus
from modelopt.objective import Objective, Target
from modelopt.plan.plan import Plan
from modelopt.plan.space import SearchSpace
from modelopt.search import Strategy


def synthetic_metrics(plan: Plan, space: SearchSpace, score: Callable[[Plan], tuple[float, int]]) -> Metrics:
    """Metrics for a plan from a known function (retention, size_bytes): no model involved."""
    retention, size = score(plan)
    return Metrics(split=Split.VAL, n_samples=100, accuracy=retention * 0.9, baseline_accuracy=0.9, retention=retention,
                   agreement=retention, size_bytes=size, float_size_bytes=10_000, compression=10_000 / size,
                   bitops=0, macs=0, eval_seconds=0.0)


def make_trial(number: int, plan: Plan, metrics: Metrics | None, objective: Objective, strategy: Strategy) -> Trial:
    if metrics is None:
        return Trial(number, plan, TrialStatus.FAILED, None, None, False, 1.0, 0.0, strategy.name, strategy.seed,
                     "test", error="synthetic failure")
    return Trial(number, plan, TrialStatus.COMPLETE, metrics, objective.reward(metrics), objective.feasible(metrics),
                 1.0, 0.0, strategy.name, strategy.seed, "test")


def check_strategy(cls: type[Strategy], space: SearchSpace, score: Callable[[Plan], tuple[float, int]],
                   n_trials: int = 12) -> None:
    """Asserts the ask/tell/state_dict contract on `space` with a synthetic score."""
    objective = Objective(Target.SIZE, 0.99)

    def drive(strategy: Strategy, start: int, n: int) -> list[str]:
        keys = []
        for i in range(start, start + n):
            (plan,) = strategy.ask(1)
            assert isinstance(plan, Plan)
            for name, choice in plan.choices:
                assert choice in space.decision(name).choices, f"{cls.name} proposed {choice!r} for {name}"
            keys.append(plan.key)
            metrics = None if i % 5 == 4 else synthetic_metrics(plan, space, score)  # some trials fail
            strategy.tell(make_trial(i, plan, metrics, objective, strategy))
        return keys

    # Same seed, same proposals.
    a, b = cls(space, objective, seed=3), cls(space, objective, seed=3)
    assert drive(a, 0, n_trials) == drive(b, 0, n_trials), f"{cls.name} is not deterministic for a fixed seed"
    # ask(n) returns n plans.
    assert len(cls(space, objective, seed=1).ask(3)) == 3
    # state_dict is JSON-serialisable and restores the same future.
    state = json.loads(json.dumps(a.state_dict()))
    c = cls(space, objective, seed=3)
    c.load_state_dict(state)
    assert drive(a, n_trials, 4) == drive(c, n_trials, 4), f"{cls.name} does not resume from its state_dict"
    # tell accepts a plan it never asked for (resume and warm start need this).
    d = cls(space, objective, seed=5)
    foreign = space.plan({dec.name: dec.choices[-1] for dec in space.decisions})
    d.tell(make_trial(0, foreign, synthetic_metrics(foreign, space, score), objective, d))
    d.ask(1)

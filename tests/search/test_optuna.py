"""The Optuna baselines: conformance, exact resume, and a synthetic objective with a known optimum."""

from __future__ import annotations

import itertools
import json
import statistics
import sys

import numpy as np
import pytest

import modelopt.search.optuna  # noqa: F401  (registers optuna-tpe and optuna-nsga2; optuna loads lazily)
from modelopt.compressors import Quantize
from modelopt.errors import ConfigError
from modelopt.evaluation.evaluator import Metrics
from modelopt.evaluation.trial import Trial, TrialStatus
from modelopt.model.layers import Layer, LayerKind
from modelopt.objective import Objective
from modelopt.plan.space import SearchSpace
from modelopt.search import STRATEGIES
from modelopt.testing.strategies import check_strategy

pytest.importorskip("optuna")  # the `optuna` extra (part of `dev`)

NAMES = ["optuna-tpe", "optuna-nsga2"]

# A synthetic model: 12 layers, each quantized to 8/4/2 bits or left float. Retention falls
# with fewer bits in proportion to a layer's sensitivity; size is bits x params.
PARAMS = [432, 2304, 2304, 4608, 9216, 9216, 18432, 36864, 36864, 73728, 147456, 640]
SENS = [8.0, 1.0, 0.5, 2.0, 0.3, 0.2, 1.5, 0.1, 0.05, 0.3, 0.02, 6.0]
LOSS = {32: 0.0, 8: 0.0004, 4: 0.003, 2: 0.02}  # retention lost per unit of sensitivity
FLOOR = 0.99
FLOAT_BYTES = 4 * sum(PARAMS)
SPACE = SearchSpace([Layer(f"l{i}", LayerKind.CONV, (p,), 0, False) for i, p in enumerate(PARAMS)],
                    [Quantize(bits=(8, 4, 2), granularity=("per_channel",), rounding=("nearest",), norm_images=0)])
OBJECTIVE = Objective("size", FLOOR)


def _bits(plan):
    return [32 if c is None else c.bits for _, c in plan.choices]


def score(plan):
    bits = _bits(plan)
    # strict=False: a test's smaller space (fewer layers) reads the first layers' sensitivities.
    retention = 1.0 - sum(s * LOSS[b] for s, b in zip(SENS, bits, strict=False))
    return retention, sum(b * p for b, p in zip(bits, PARAMS, strict=False)) // 8


def metrics(plan) -> Metrics:
    retention, size = score(plan)
    return Metrics(split="val", n_samples=100, accuracy=0.9 * retention, baseline_accuracy=0.9, retention=retention,
                   agreement=retention, size_bytes=size, float_size_bytes=FLOAT_BYTES,
                   compression=FLOAT_BYTES / size, bitops=0, macs=0, eval_seconds=0.0)


def make_trial(number, plan, strategy, fail=False) -> Trial:
    if fail:
        return Trial(number, plan, TrialStatus.FAILED, None, None, False, 1.0, 0.0, strategy.name, strategy.seed, "t")
    m = metrics(plan)
    return Trial(number, plan, TrialStatus.COMPLETE, m, OBJECTIVE.reward(m), OBJECTIVE.feasible(m), 1.0, 0.0,
                 strategy.name, strategy.seed, "t")


def best_reward() -> float:
    """The exact optimum (meet in the middle over the 4^12 plans; checked once against brute force)."""
    def half(idx):
        return [(sum(SENS[i] * LOSS[b] for i, b in zip(idx, combo, strict=True)),
                 sum(b * PARAMS[i] for i, b in zip(idx, combo, strict=True)))
                for combo in itertools.product(LOSS, repeat=len(idx))]

    right = sorted(half(range(6, 12)))
    r_loss = np.array([x[0] for x in right])
    r_min_size = np.minimum.accumulate(np.array([x[1] for x in right]))
    best = min(size + r_min_size[k - 1] for loss, size in half(range(6))
               if (k := int(np.searchsorted(r_loss, 1.0 - FLOOR - loss + 1e-12, side="right"))))
    return FLOAT_BYTES / (best // 8)


def run(name, seed, n=150, **kwargs):
    """Feasible (size fraction, retention) points a strategy found in `n` trials."""
    strategy = STRATEGIES.get(name)(SPACE, OBJECTIVE, seed=seed, **kwargs)
    points = []
    for i in range(n):
        (plan,) = strategy.ask(1)
        trial = make_trial(i, plan, strategy)
        strategy.tell(trial)
        if trial.feasible:
            points.append((trial.metrics.size_bytes / FLOAT_BYTES, trial.metrics.retention))
    return points


def best_of(points):
    return max((1.0 / size for size, _ in points), default=0.0)


def hypervolume(points):
    """Share of [FLOOR, 1] x [0, float size] dominated by the points (higher retention, smaller size)."""
    points = sorted(points)
    xs = sorted({s for s, _ in points} | {1.0})
    area, best, j = 0.0, FLOOR, 0
    for a, b in itertools.pairwise(xs):
        while j < len(points) and points[j][0] <= a:
            best = max(best, points[j][1])
            j += 1
        area += (b - a) * (best - FLOOR)
    return area / (1.0 - FLOOR)


# ---- the contract ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_conformance(name):
    layers = [Layer("a", LayerKind.CONV, (16, 16, 3, 3), 1000, False),
              Layer("b", LayerKind.LINEAR, (10, 64), 640, True)]
    space = SearchSpace(layers, [Quantize(bits=(8, 4), granularity=("per_channel",), rounding=("nearest",),
                                          norm_images=0)])
    check_strategy(STRATEGIES.get(name), space, score=lambda p: (1.0 - 0.002 * sum(32 - b for b in _bits(p)) / 4,
                                                                 100 * sum(_bits(p))))


@pytest.mark.parametrize("name,kwargs", [("optuna-tpe", {"n_startup_trials": 4}),
                                         ("optuna-nsga2", {"population_size": 4})])
def test_resume_is_exact_past_startup_with_pending_and_foreign_trials(name, kwargs):
    # Past TPE's random start-up and several NSGA-II generations, asked in batches, with a
    # warm-start trial, failures, and one batch half told when the state is saved.
    cls = STRATEGIES.get(name)
    a = cls(SPACE, OBJECTIVE, seed=7, **kwargs)
    a.tell(make_trial(0, SPACE.uniform("quantize", SPACE.decisions[0].choices[1]), a))  # never asked
    number = 1
    for _ in range(6):
        for plan in a.ask(3):
            a.tell(make_trial(number, plan, a, fail=number % 7 == 0))
            number += 1
    batch = a.ask(3)
    a.tell(make_trial(number, batch[0], a))
    state = json.loads(json.dumps(a.state_dict()))
    assert [t["state"] for t in state["trials"]].count("RUNNING") == 2
    b = cls(SPACE, OBJECTIVE, seed=7, **kwargs)
    b.load_state_dict(state)
    for s in (a, b):
        for i, plan in enumerate(batch[1:]):
            s.tell(make_trial(number + 1 + i, plan, s))
    futures = []
    for s in (a, b):
        keys = []
        for i in range(4):
            plans = s.ask(2)
            keys += [p.key for p in plans]
            for j, plan in enumerate(plans):
                s.tell(make_trial(100 + 2 * i + j, plan, s))
        futures.append(keys)
    assert futures[0] == futures[1]
    assert json.dumps(a.state_dict()) == json.dumps(b.state_dict())


def test_nsga2_resume_keeps_parents_chosen_before_late_trials_finished():
    # Generation 1's parents are chosen from the first 4 of 6 generation-0 trials; the last two
    # finish later. A restore that re-chose parents from all 6 would breed different children.
    cls = STRATEGIES.get("optuna-nsga2")
    a = cls(SPACE, OBJECTIVE, seed=1, population_size=4)
    first = a.ask(6)
    for i, plan in enumerate(first[:4]):
        a.tell(make_trial(i, plan, a))
    (child,) = a.ask(1)
    for i, plan in enumerate(first[4:]):
        a.tell(make_trial(4 + i, plan, a))
    b = cls(SPACE, OBJECTIVE, seed=1, population_size=4)
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))
    futures = []
    for s in (a, b):
        s.tell(make_trial(6, child, s))
        keys = []
        for i in range(6):
            (plan,) = s.ask(1)
            keys.append(plan.key)
            s.tell(make_trial(7 + i, plan, s))
        futures.append(keys)
    assert futures[0] == futures[1]


@pytest.mark.parametrize("name", NAMES)
def test_repeated_plans_and_failures_are_told_to_the_trials_that_asked(name):
    space = SearchSpace([Layer("a", LayerKind.CONV, (4, 4), 16, False)],
                        [Quantize(bits=(8,), granularity=("per_channel",), rounding=("nearest",), norm_images=0)])
    s = STRATEGIES.get(name)(space, OBJECTIVE, seed=0)
    plans = s.ask(6)  # only two plans exist: keys repeat
    assert len({p.key for p in plans}) < len(plans)
    for i, plan in enumerate(plans):
        s.tell(make_trial(i, plan, s, fail=i == 0))
    states = [t["state"] for t in s.state_dict()["trials"]]
    assert states == ["FAIL"] + ["COMPLETE"] * 5  # each told to a trial that asked: none left running, none added


def test_nsga2_records_the_retention_floor_as_a_constraint():
    s = STRATEGIES.get("optuna-nsga2")(SPACE, OBJECTIVE, seed=0)
    worst = SPACE.uniform("quantize", SPACE.decisions[0].choices[-1])  # 2 bits everywhere: far below the floor
    s.tell(make_trial(0, worst, s))
    (plan,) = s.ask(1)
    s.tell(make_trial(1, plan, s))
    trials = s.state_dict()["trials"]
    assert trials[0]["values"] == [pytest.approx(score(worst)[0]), score(worst)[1]]
    assert FLOOR - score(worst)[0] > 0
    for rec, p in zip(trials, (worst, plan), strict=True):
        # Where Optuna reads constraints: "constraints:<name>" from 5.0, a "constraints" list before.
        attrs = rec["system_attrs"]
        recorded = attrs["constraints:retention"] if "constraints:retention" in attrs else attrs["constraints"][0]
        assert recorded == pytest.approx(FLOOR - score(p)[0])


def test_a_plan_from_another_space_is_refused():
    s = STRATEGIES.get("optuna-tpe")(SPACE, OBJECTIVE, seed=0)
    other = SearchSpace(SPACE.layers.values(), [Quantize(bits=(8, 4, 2), granularity=("per_tensor",),
                                                         rounding=("nearest",), norm_images=0)])
    with pytest.raises(ConfigError, match="another search space"):
        s.tell(make_trial(0, other.uniform("quantize", other.decisions[0].choices[-1]), s))


def test_missing_optuna_is_a_config_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "optuna", None)  # makes `import optuna` raise ImportError
    with pytest.raises(ConfigError, match=r"pip install 'modelopt\[optuna\]'"):
        STRATEGIES.get("optuna-tpe")(SPACE, OBJECTIVE)


def test_state_from_another_strategy_is_refused():
    tpe = STRATEGIES.get("optuna-tpe")(SPACE, OBJECTIVE, seed=0)
    with pytest.raises(ConfigError, match="optuna-nsga2"):
        STRATEGIES.get("optuna-nsga2")(SPACE, OBJECTIVE).load_state_dict(tpe.state_dict())


# ---- search quality on a known optimum ------------------------------------------------------
# Bars sit between what random search reaches and what the strategy reached over 6-10 seeds
# (best reward found by TPE: 0.61-0.90 of the optimum with Optuna 5.0, 0.49-0.94 with 4.5;
# random search 0.18-0.59. NSGA-II hypervolume 0.49-0.71, random 0.12-0.45). Medians over
# seeds keep the bars valid across Optuna versions; each test checks random stays below its bar.


@pytest.mark.slow
def test_tpe_gets_close_to_the_known_optimum_and_beats_random_search():
    optimum = best_reward()
    assert optimum == pytest.approx(10.353, abs=1e-3)  # brute force over all 4^12 plans agrees
    bar = 0.55 * optimum
    random = [best_of(run("random", seed)) for seed in range(5)]
    assert statistics.median(random) < bar, "the bar must be one that random search does not clear"
    tpe = [best_of(run("optuna-tpe", seed)) for seed in range(3)]
    assert statistics.median(tpe) >= bar, [round(r / optimum, 3) for r in tpe]


def test_nsga2_covers_more_of_the_feasible_front_than_random_search():
    bar = 0.46
    random = [hypervolume(run("random", seed)) for seed in range(5)]
    assert statistics.median(random) < bar, "the bar must be one that random search does not clear"
    nsga = [hypervolume(run("optuna-nsga2", seed)) for seed in range(3)]
    assert statistics.median(nsga) >= bar, nsga

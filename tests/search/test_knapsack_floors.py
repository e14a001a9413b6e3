"""The knapsack in a curve run (`use_floors`): a bracket on the loss budget per floor, its plans aimed at the floors in
turn, each plan's result moving the bracket of the floor it aimed at, and all of it kept across a resume."""

from __future__ import annotations

import dataclasses
import json

import numpy as np

from modelopt.compressors import Quantize
from modelopt.model.layers import Layer, LayerKind
from modelopt.objective import Objective
from modelopt.plan.space import SearchSpace
from modelopt.search.knapsack import KnapsackSearch
from modelopt.testing.strategies import make_trial, synthetic_metrics

FLOORS = (0.995, 0.99, 0.98, 0.97)
LAYERS = [Layer(f"l{i}", LayerKind.CONV, (8 * (i + 1), 16, 3, 3), 1000, False) for i in range(6)]
SPACE = SearchSpace(LAYERS, [Quantize(bits=(8, 4, 2), granularity=("per_channel",), rounding=("nearest",),
                                      norm_images=0)])
QUANT = SPACE.compressors["quantize"]
SEARCH = Objective("size", 0.99, 0.0, floors=FLOORS).search  # a curve run's strategies are given the lowest floor
LOSS = np.random.default_rng(0).uniform([0.0, 0.0, 0.001, 0.01], [0.0, 0.001, 0.006, 0.05], size=(len(LAYERS), 4))


def score(plan):
    drop = sum(LOSS[i][d.choices.index(plan[d.name])] for i, d in enumerate(SPACE.decisions))
    return 1.0 - drop, 1000 + sum(QUANT.weight_bytes(SPACE.layers[d.layer], plan[d.name]) for d in SPACE.decisions)


def knapsack(seed: int = 0, floors=FLOORS) -> KnapsackSearch:
    s = KnapsackSearch(SPACE, SEARCH, seed=seed)
    s.use_floors(floors)
    # The one-pass estimates in place of the Fisher pass: the knapsack phase from the first ask.
    s.use_loss_estimates({(d.name, j): float(LOSS[i][j]) for i, d in enumerate(SPACE.decisions)
                          for j in range(1, len(d.choices))})
    return s


def tell(s: KnapsackSearch, number: int, plan, retention: float | None = None) -> None:
    m = synthetic_metrics(plan, SPACE, score)
    if retention is not None:
        m = dataclasses.replace(m, retention=retention)
    s.tell(make_trial(number, plan, m, SEARCH, s))


def test_plans_are_aimed_at_each_floor_in_turn_from_its_own_loss():
    s = knapsack()
    plans = s.ask(len(FLOORS))
    assert [s._aim_of[p.key] for p in plans] == [0, 1, 2, 3]
    assert [round(s._L_of[p.key], 4) for p in plans] == [0.005, 0.01, 0.02, 0.03]  # each floor's opening budget
    sizes = [score(p)[1] for p in plans]
    assert sizes == sorted(sizes, reverse=True) and sizes[0] > sizes[-1]


def test_a_plan_moves_only_the_bracket_of_the_floor_it_aimed_at():
    s = knapsack()
    plans = s.ask(len(FLOORS))
    tell(s, 0, plans[0], retention=0.975)  # aimed at 99.5 %, keeps 97.5 %: too much loss there
    assert _rounded(s.bounds) == [[None, 0.005], [None, None], [None, None], [None, None]]
    tell(s, 1, plans[3], retention=0.975)  # aimed at 97 %: clears it
    assert _rounded(s.bounds) == [[None, 0.005], [None, None], [None, None], [0.03, None]]
    assert s.hi is None and round(s.lo, 6) == 0.03  # the search's floor is the lowest


def test_a_resumed_curve_knapsack_continues_as_it_would_have():
    a, b = knapsack(3), knapsack(3)

    def drive(s, start, n):
        keys = []
        for i in range(start, start + n):
            (plan,) = s.ask(1)
            tell(s, i, plan)
            keys.append(plan.key)
        return keys

    assert drive(a, 0, 6) == drive(b, 0, 6)
    c = knapsack(3)
    c.load_state_dict(json.loads(json.dumps(a.state_dict())))
    assert c.bounds == a.bounds and c._asked == a._asked
    assert drive(a, 6, 5) == drive(c, 6, 5)


def test_a_one_floor_knapsack_keeps_its_state_format():
    s = knapsack(floors=(0.99,))
    (plan,) = s.ask(1)
    tell(s, 0, plan)
    state = s.state_dict()
    assert "bounds" not in state and (state["lo"], state["hi"]) == (s.lo, s.hi) and s.bounds == [[s.lo, s.hi]]


def _rounded(bounds):
    return [[None if v is None else round(v, 6) for v in b] for b in bounds]

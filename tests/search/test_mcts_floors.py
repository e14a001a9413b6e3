"""MCTS in a curve run (`use_floors`): rollouts aimed at each floor in turn, a trial valued over the floors, each
floor's margin learnt from the plans aimed there, and all of it kept across a resume."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from modelopt.compressors import Quantize
from modelopt.model.layers import Layer, LayerKind
from modelopt.objective import Objective
from modelopt.plan.space import SearchSpace
from modelopt.search import MCTS
from modelopt.search.mcts_floors import Aim
from modelopt.search.mcts_tree import trial_value
from modelopt.testing.strategies import make_trial, synthetic_metrics

FLOORS = (0.995, 0.99, 0.98, 0.97)
LAYERS = [Layer(f"l{i}", LayerKind.CONV, (c, c, 3, 3), 1000, False) for i, c in enumerate([16, 32, 64, 32, 16, 64])]
SPACE = SearchSpace(LAYERS, [Quantize(bits=(8, 4, 3, 2), granularity=("per_channel",), rounding=("nearest",),
                                      norm_images=0)])
NOISE = {32: 0.0, 8: 0.00003, 4: 0.01, 3: 0.04, 2: 0.15}
FLOAT_BYTES = sum(layer.params * 4 for layer in LAYERS)
SEARCH = Objective("size", 0.99, 0.0, floors=FLOORS).search  # what a curve run's strategy is given: the lowest floor


def score(plan):
    noise = sum(NOISE[32 if c is None else c.bits] for _, c in plan.choices) / 2
    size = sum(SPACE.compressors["quantize"].weight_bytes(SPACE.layers[n.split("/")[0]], c) for n, c in plan.choices)
    return 1.0 - noise**2, size


def curve_mcts(seed: int = 0) -> MCTS:
    strategy = MCTS(SPACE, SEARCH, seed=seed)
    strategy.use_floors(FLOORS)
    return strategy


def drive(strategy: MCTS, start: int, n: int) -> list[str]:
    keys = []
    for i in range(start, start + n):
        (plan,) = strategy.ask(1)
        keys.append(plan.key)
        strategy.tell(make_trial(i, plan, synthetic_metrics(plan, SPACE, score), SEARCH, strategy))
    return keys


def test_plans_are_aimed_at_each_floor_in_turn():
    strategy = curve_mcts()
    plans = strategy.ask(len(FLOORS) + 1)
    assert [strategy.aim.aimed[p.key] for p in plans] == [0, 1, 2, 3, 0]


def test_a_lower_floor_allows_more_loss_and_so_a_smaller_plan():
    strategy = curve_mcts()
    assert [round(strategy._allowed(f) ** (1 / strategy.model.power), 4) for f in FLOORS] == [0.005, 0.01, 0.02, 0.03]
    sizes = []
    for aim in range(len(FLOORS)):  # the same posterior draw, aimed at each floor
        (idx,) = strategy._rollouts((), np.random.default_rng(1), [aim])
        sizes.append(score(strategy._plan([int(j) for j in idx]))[1])
    assert sizes == sorted(sizes, reverse=True) and sizes[0] > sizes[-1]


def test_a_trial_is_valued_over_the_floors_it_clears():
    strategy = curve_mcts()
    plan = SPACE.plan({d.name: next(c for c in d.choices if c is not None and c.bits == 2) for d in SPACE.decisions})
    both = {r: make_trial(0, plan, _at(plan, r), SEARCH, strategy) for r in (0.999, 0.975, 0.96)}
    at_every, at_lowest, at_none = (strategy.aim.value(t, SEARCH) for t in both.values())
    # Clearing every floor, it is worth what the lowest floor alone makes of it (1 + ln reduction); clearing only
    # the lowest, a quarter of the part above 1; clearing none, what a one-floor run makes of it (below 1).
    assert at_every == pytest.approx(trial_value(both[0.999], SEARCH))
    assert at_every == pytest.approx(1 + np.log(FLOAT_BYTES / score(plan)[1]))
    assert at_lowest - 1 == pytest.approx((at_every - 1) / 4)
    assert at_none == trial_value(both[0.96], SEARCH) < 1.0
    one_floor = MCTS(SPACE, SEARCH, seed=0)
    one_floor.use_floors((0.97,))  # one floor: a one-floor run, valued as before
    assert not one_floor.aim.curve and one_floor.aim.value(both[0.975], SEARCH) == trial_value(both[0.975], SEARCH)


def test_each_floor_learns_its_own_margin():
    strategy = curve_mcts()
    plans = strategy.ask(len(FLOORS))
    # The plan aimed at 99.5 % keeps 97.5 %: it misses its floor, and only that floor's margin shrinks.
    strategy.tell(make_trial(0, plans[0], _at(plans[0], 0.975), SEARCH, strategy))
    assert strategy.aim.margins == [0.95, 1.0, 1.0, 1.0]
    # The plan aimed at 97 % clears it: that floor's margin grows.
    strategy.tell(make_trial(1, plans[3], _at(plans[3], 0.975), SEARCH, strategy))
    assert strategy.aim.margins == [0.95, 1.0, 1.0, 1.04]


def test_a_resumed_curve_search_continues_as_it_would_have():
    a, b = curve_mcts(3), curve_mcts(3)
    assert drive(a, 0, 6) == drive(b, 0, 6)
    in_flight = a.ask(1)[0]
    state = json.loads(json.dumps(a.state_dict()))
    assert state["aim"]["aimed"] == {in_flight.key: 2}
    c = curve_mcts(3)
    c.load_state_dict(state)
    assert c.aim == a.aim
    a.tell(make_trial(6, in_flight, synthetic_metrics(in_flight, SPACE, score), SEARCH, a))
    c.tell(make_trial(6, in_flight, synthetic_metrics(in_flight, SPACE, score), SEARCH, c))
    assert drive(a, 7, 4) == drive(c, 7, 4)


def test_a_one_floor_search_keeps_its_state_format():
    strategy = MCTS(SPACE, Objective("size", 0.99, 0.0), seed=0)
    strategy.use_floors((0.99,))
    drive(strategy, 0, 3)
    state = strategy.state_dict()
    assert "aim" not in state and state["margin"] == strategy.aim.margins[0]
    assert Aim.restored({"floors": [0.9]}, FLOORS) == Aim(FLOORS)  # another run's aim is not taken


def _at(plan, retention):
    """Metrics of `plan` with the given retention on 2,000 val images (1,640 right), beside the float layers' bytes."""
    m = synthetic_metrics(plan, SPACE, score)
    lost = round((1 - retention) * 1640)
    return dataclasses.replace(m, retention=retention, n_samples=2000, base_right=1640, lost=lost, gained=0,
                               float_size_bytes=FLOAT_BYTES, compression=FLOAT_BYTES / m.size_bytes)

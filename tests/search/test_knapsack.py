"""The sensitivity + knapsack baseline on synthetic objectives with known optima (its DP: test_mckp.py)."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest

from modelopt.compressors import Granularity, Prune, PruneKind, PruneSpec, Quantize, QuantSpec
from modelopt.compressors.contract import ChannelAnalysis, ChannelGroup
from modelopt.model.layers import Layer, LayerKind
from modelopt.objective import Objective
from modelopt.plan.space import SearchSpace
from modelopt.search import STRATEGIES
from modelopt.search.knapsack import KnapsackSearch
from modelopt.testing.strategies import check_strategy, make_trial, synthetic_metrics

CONFORMANCE_LAYERS = [
    Layer("a", LayerKind.CONV, (16, 16, 3, 3), 1000, False),
    Layer("b", LayerKind.CONV, (32, 16, 3, 3), 2000, False),
    Layer("c", LayerKind.LINEAR, (10, 64), 640, True),
]


def conformance_score(plan):
    bits = [32 if c is None else c.bits for _, c in plan.choices]
    return 1.0 - 0.004 * sum(32 - b for b in bits) / 4, 100 * sum(bits)


def test_registered_and_conformant():
    assert STRATEGIES.get("knapsack") is KnapsackSearch
    space = SearchSpace(CONFORMANCE_LAYERS, [Quantize(bits=(8, 4), granularity=("per_channel",),
                                                      rounding=("nearest",), norm_images=0)])
    check_strategy(KnapsackSearch, space, conformance_score, n_trials=12)
    check_strategy(KnapsackSearch, space, conformance_score, n_trials=20)  # restore deep in the knapsack phase


LAYERS = [Layer(f"l{i}", LayerKind.CONV, (8 * (i + 1), 16, 3, 3), 1000, False) for i in range(6)]
SPACE = SearchSpace(LAYERS, [Quantize(bits=(8, 4, 2), granularity=("per_channel",), rounding=("nearest",),
                                      norm_images=0)])
QUANT = SPACE.compressors["quantize"]
OBJ = Objective("size", 0.99)


def _loss_table(seed):
    rng = np.random.default_rng(seed)
    # per decision, per choice (None, int8, int4, int2): int8 nearly free, int2 ruinous
    return [[0.0, rng.uniform(0, 0.001), rng.uniform(0.001, 0.006), rng.uniform(0.01, 0.05)] for _ in LAYERS]


def _size(plan):
    return 1000 + sum(QUANT.weight_bytes(SPACE.layers[d.layer], plan[d.name]) for d in SPACE.decisions)


def _drops(plan, table):
    return [table[i][d.choices.index(plan[d.name])] for i, d in enumerate(SPACE.decisions)]


def _optimum(score):
    """The true best plan by brute force over all 4**6 plans."""
    best = None
    for combo in itertools.product(*(d.choices for d in SPACE.decisions)):
        plan = SPACE.plan(dict(zip((d.name for d in SPACE.decisions), combo, strict=True)))
        r, s = score(plan)
        if r >= OBJ.min_retention and (best is None or s < best[1]):
            best = (plan, s, r)
    return best


def _run(strategy, score, n_trials, batch=1):
    """Ask/tell on a synthetic score; returns the trials in order."""
    trials = []
    while len(trials) < n_trials:
        for plan in strategy.ask(batch):
            t = make_trial(len(trials), plan, synthetic_metrics(plan, SPACE, score), OBJ, strategy)
            strategy.tell(t)
            trials.append(t)
    return trials


def _best_size(trials):
    sizes = [t.metrics.size_bytes for t in trials if t.feasible]
    return min(sizes) if sizes else None


N_SENS = sum(len(d.choices) - 1 for d in SPACE.decisions)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_additive_objective_optimum_right_after_the_sensitivity_pass(seed):
    table = _loss_table(seed)

    def score(plan):
        return 1.0 - sum(_drops(plan, table)), _size(plan)

    _, opt_size, opt_ret = _optimum(score)
    # Keep the test meaningful: the optimum quantizes something and is not at the rounding edge.
    assert opt_size < _size(SPACE.plan()) and opt_ret > 0.99 + 1e-5
    s = KnapsackSearch(SPACE, OBJ, seed=seed)
    trials = _run(s, score, N_SENS + 1)
    assert [t.plan for t in trials[:N_SENS]] == [
        SPACE.plan({d.name: c}) for d in SPACE.decisions for c in d.choices if c is not None
    ]
    first = trials[N_SENS]  # the very first knapsack plan is optimal (ties in size may pick another plan)
    assert first.feasible and first.metrics.size_bytes == opt_size
    # and then it keeps proposing new, never better-than-optimal feasible plans
    more = _run(s, score, 10)
    keys = [t.plan.key for t in trials + more]
    assert len(set(keys)) == len(keys)
    assert _best_size(trials + more) == opt_size


@pytest.mark.parametrize("seed", [3, 4, 5])
def test_pessimistic_additivity_shrinks_L_until_feasible(seed):
    table = _loss_table(seed)

    def score(plan):
        drops = _drops(plan, table)
        k = sum(d > 0 for d in drops)
        return 1.0 - sum(drops) * (1 + 0.5 * max(k - 1, 0)), _size(plan)  # each extra layer hurts more

    s = KnapsackSearch(SPACE, OBJ, seed=0)
    trials = _run(s, score, N_SENS + 1)
    assert not trials[-1].feasible  # the additive model's L0 plan fails here
    trials += _run(s, score, 8)
    assert s.hi is not None and s.hi < 1 - OBJ.min_retention
    best = _best_size(trials[N_SENS:])
    assert best is not None and best < _size(SPACE.plan())
    # Close to the true optimum of the non-additive objective.
    assert best <= 1.1 * _optimum(score)[1]


@pytest.mark.parametrize("seed", [3, 4, 5])
def test_optimistic_additivity_grows_L_to_the_true_optimum(seed):
    table = _loss_table(seed)

    def score(plan):
        drops = _drops(plan, table)
        k = sum(d > 0 for d in drops)
        return 1.0 - sum(drops) / (1 + 0.5 * max(k - 1, 0)), _size(plan)  # layers together hurt less

    opt_size = _optimum(score)[1]
    s = KnapsackSearch(SPACE, OBJ, seed=0)
    trials = _run(s, score, N_SENS + 1)
    first = trials[-1]
    assert first.feasible and first.metrics.size_bytes > opt_size
    trials += _run(s, score, 10)
    assert s.lo is not None and s.lo > 1 - OBJ.min_retention
    assert _best_size(trials) == opt_size


def test_batched_asks_give_distinct_plans_for_different_L():
    table = _loss_table(0)

    def score(plan):
        return 1.0 - 0.8 * sum(_drops(plan, table)), _size(plan)

    s = KnapsackSearch(SPACE, OBJ, seed=0)
    first = s.ask(N_SENS + 3)  # the sensitivity plans and three knapsack plans before any result
    assert len({p.key for p in first}) == len(first)
    for i, p in enumerate(first):
        s.tell(make_trial(i, p, synthetic_metrics(p, SPACE, score), OBJ, s))
    trials = _run(s, score, 24, batch=4)
    keys = [p.key for p in first] + [t.plan.key for t in trials]
    assert len(set(keys)) == len(keys)
    assert len(set(s._L_of.values())) == len(s._L_of)


def test_foreign_single_decision_trial_replaces_its_sensitivity_ask_and_failures_are_never_picked():
    table = _loss_table(0)

    def score(plan):
        return 1.0 - sum(_drops(plan, table)), _size(plan)

    s = KnapsackSearch(SPACE, OBJ, seed=0)
    d0, d1 = SPACE.decisions[0], SPACE.decisions[1]
    foreign = SPACE.plan({d0.name: d0.choices[1]})
    s.tell(make_trial(0, foreign, synthetic_metrics(foreign, SPACE, score), OBJ, s))
    asked = s.ask(N_SENS)
    assert foreign not in asked and len(asked) == N_SENS  # the slot went to the first knapsack plan
    for i, p in enumerate(asked):
        failed = p == SPACE.plan({d1.name: d1.choices[2]})  # int4 on l1 crashes
        s.tell(make_trial(i + 1, p, None if failed else synthetic_metrics(p, SPACE, score), OBJ, s))
    for p in s.ask(6):
        assert p[d1.name] != d1.choices[2]


def test_state_restores_the_same_future_mid_knapsack():
    table = _loss_table(1)

    def score(plan):
        return 1.0 - 1.3 * sum(_drops(plan, table)), _size(plan)

    a = KnapsackSearch(SPACE, OBJ, seed=7)
    _run(a, score, N_SENS + 4, batch=2)
    state = json.loads(json.dumps(a.state_dict()))
    assert state["phase"] == "knapsack"
    b = KnapsackSearch(SPACE, OBJ, seed=7)
    b.load_state_dict(state)
    ta, tb = _run(a, score, 12, batch=3), _run(b, score, 12, batch=3)
    assert [t.plan.key for t in ta] == [t.plan.key for t in tb]


def test_a_known_plan_moves_L_without_spending_a_trial():
    layers = [Layer("big", LayerKind.CONV, (64, 64, 3, 3), 1000, False),
              Layer("small", LayerKind.CONV, (8, 8, 3, 3), 1, False)]
    space = SearchSpace(layers, [Quantize(bits=(8, 4), granularity=("per_channel",), rounding=("nearest",),
                                          norm_images=0)])
    big, small = space.decisions
    # Only int4 on "big" fits L0 = 0.01: the knapsack's first answer is a sensitivity plan already measured.
    loss = {big.choices[1]: 0.001, big.choices[2]: 0.002}

    def score(plan):
        drop = loss.get(plan[big.name], 0.0) + (0.0 if plan[small.name] is None else 0.03)
        return 1.0 - drop, 100 + sum(QUANT.weight_bytes(space.layers[d.layer], plan[d.name]) for d in space.decisions)

    s = KnapsackSearch(space, OBJ, seed=0)
    asked = s.ask(4)
    for i, p in enumerate(asked):
        s.tell(make_trial(i, p, synthetic_metrics(p, space, score), OBJ, s))
    assert s.solve(0.01) == space.plan({big.name: big.choices[2]}) and s.lo is None
    (plan,) = s.ask(1)
    assert plan.key not in {p.key for p in asked}
    assert s.lo is not None and s.lo >= 0.01  # the known feasible answer at L0 became the lower bound



def _option_costs(target):
    """{(prune choice, quantize choice): cost} the knapsack prices one block's conv1 options at."""
    group = ChannelGroup((("b.conv1", True), ("b.conv2", False)), 2)
    layers = [Layer("b.conv1", LayerKind.CONV, (16, 16, 3, 3), 16 * 16 * 9 * 64, False).noted(
                  {ChannelAnalysis.name: group}),
              Layer("b.conv2", LayerKind.CONV, (16, 16, 3, 3), 16 * 16 * 9 * 64, False)]
    space = SearchSpace(layers, [Quantize(bits=(8,), granularity=("per_channel",), rounding=("nearest",),
                                          norm_images=0),
                                 Prune(sparsity=(0.5,), kind=("unstructured", "structured"), sparse_images=0,
                                       repair_images=0)])
    ks = KnapsackSearch(space, Objective(target, 0.99), seed=0)
    idx, options, costs = next(g for g in ks.options._groups if space.decisions[g[0][0]].layer == "b.conv1")
    decs = [space.decisions[i] for i in idx]
    assert [d.compressor for d in decs] == ["prune", "quantize"]  # chain order: prune first
    return {tuple(d.choices[j] for d, j in zip(decs, opt, strict=True)): c
            for opt, c in zip(options, costs, strict=True)}


def test_knapsack_prices_macs_as_macs_and_a_layers_chain_as_the_evaluator_stores_it():
    int8 = QuantSpec(8, Granularity.PER_CHANNEL)
    sparse, channels = PruneSpec(0.5, PruneKind.UNSTRUCTURED), PruneSpec(0.5, PruneKind.STRUCTURED)
    macs = _option_costs("macs")
    assert macs[(None, None)] == macs[(None, int8)] == macs[(sparse, None)] == 16 * 16 * 9 * 64  # no MAC removed
    assert macs[(channels, None)] == macs[(channels, int8)] == 8 * 16 * 9 * 64  # half the output channels
    size = _option_costs("size")
    n = 16 * 16 * 9
    # Pruned then quantized: half the values as 8-bit codes, their positions (a bitmask), 16 float16 scales.
    assert size[(sparse, int8)] == n // 2 + math.ceil(n / 8) + 16 * 2 < size[(None, int8)] == n + 16 * 2

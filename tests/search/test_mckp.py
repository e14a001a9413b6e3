"""The multiple-choice knapsack DP against brute force: one budget at a time, and batched."""

from __future__ import annotations

import itertools
import math
import time

import numpy as np
import pytest

from modelopt.search.mckp import solve_binned, solve_mckp


def brute(losses, costs, budget):
    """Least total cost over all combinations with total loss <= budget (inf when none)."""
    best = math.inf
    for combo in itertools.product(*(range(len(ls)) for ls in losses)):
        loss = sum(losses[g][o] for g, o in enumerate(combo))
        if loss <= budget + 1e-12:
            best = min(best, sum(costs[g][o] for g, o in enumerate(combo)))
    return best


def total(table, picks):
    return sum(table[g][o] for g, o in enumerate(picks))


def test_dp_is_exact_on_grid_losses():
    rng = np.random.default_rng(0)
    for trial in range(20):
        # 5 groups x 3 options; float option first (loss 0, the largest cost)
        losses = [[0.0, *(rng.integers(0, 40, 2) * 1e-3)] for _ in range(5)]
        costs = [[100.0, *rng.integers(1, 100, 2).astype(float)] for _ in range(5)]
        for budget in (0.0, 0.01, 0.025, 0.04, 0.2):
            picks = solve_mckp(losses, costs, budget, bins=1000)
            assert total(losses, picks) <= budget + 1e-9
            assert total(costs, picks) == brute(losses, costs, budget), (trial, budget, losses, costs)


def test_dp_off_grid_is_within_half_a_bin_per_group_of_the_budget():
    rng = np.random.default_rng(1)
    groups, bins = 5, 200
    for _ in range(30):
        losses = [[0.0, *rng.uniform(0, 0.02, 2)] for _ in range(groups)]
        costs = [[100.0, *rng.uniform(1, 100, 2)] for _ in range(groups)]
        budget = float(rng.uniform(0.005, 0.05))
        slack = groups * budget / bins / 2  # each loss is rounded to the nearest bin
        picks = solve_mckp(losses, costs, budget, bins=bins)
        got = total(costs, picks)
        assert total(losses, picks) <= budget + slack
        assert brute(losses, costs, budget + slack) <= got <= brute(losses, costs, budget - slack)


def test_dp_rounds_to_nearest_rather_than_taxing_every_group_a_bin():
    # Ten losses of 1.2 bins fit a 12-bin budget; rounding each up to 2 bins would drop four of them.
    step = 0.001
    losses = [[0.0, 1.2 * step]] * 10 + [[0.0, 5 * step]]  # the last group keeps the budget binding
    picks = solve_mckp(losses, [[2.0, 1.0]] * 10 + [[2.0, 1.9]], 12 * step, bins=12)
    assert picks == [1] * 10 + [0]


def test_dp_ties_go_to_the_first_option():
    # Equal costs (a global decision costs nothing): keep the float option, not a lossy one.
    assert solve_mckp([[0.0, 0.001], [0.0, 0.0]], [[5.0, 5.0], [3.0, 3.0]], 0.01) == [0, 0]
    assert solve_mckp([[0.0, 0.001], [0.0, 0.0]], [[5.0, 5.0], [3.0, 3.0]], 0.0005) == [0, 0]


def test_dp_never_picks_infinite_loss_and_budget_zero_keeps_loss_free_options():
    losses = [[0.0, math.inf, 0.001], [0.0, 0.0, math.inf]]
    costs = [[10.0, 1.0, 5.0], [10.0, 7.0, 1.0]]
    assert solve_mckp(losses, costs, 1.0) == [2, 1]
    assert solve_mckp(losses, costs, 0.0) == [0, 1]


def test_dp_is_fast_on_a_large_instance():
    rng = np.random.default_rng(2)
    losses = [[0.0, *rng.uniform(0, 0.002, 4)] for _ in range(300)]
    costs = [[4000.0, *rng.uniform(100, 1000, 4)] for _ in range(300)]
    solve_mckp(losses, costs, 0.01, bins=2000)  # warm-up
    t = time.perf_counter()
    picks = solve_mckp(losses, costs, 0.01, bins=2000)
    assert time.perf_counter() - t < 1.0
    assert total(losses, picks) <= 0.01 and any(picks)


def test_batched_dp_solves_each_instance_as_if_alone_and_exactly():
    # MCTS's rollouts: R instances with their own (whole-bin) losses and shared costs.
    rng = np.random.default_rng(3)
    for _ in range(20):
        groups, options, rows, cap = 5, 3, 6, 30
        weights = [np.concatenate([np.zeros((rows, 1), dtype=int), rng.integers(0, 15, (rows, options - 1))], axis=1)
                   for _ in range(groups)]
        costs = [np.array([100.0, *rng.integers(1, 100, options - 1)]) for _ in range(groups)]
        picks = solve_binned(weights, costs, cap)
        assert picks.shape == (rows, groups)
        for r in range(rows):
            alone = solve_binned([w[r : r + 1] for w in weights], costs, cap)
            assert (alone[0] == picks[r]).all()
            losses = [w[r].tolist() for w in weights]
            assert total(losses, picks[r]) <= cap
            assert total(costs, picks[r]) == brute(losses, costs, cap)


def test_batched_dp_never_picks_an_infinite_cost_and_names_a_group_that_cannot_fit():
    weights = [np.array([[0, 1]]), np.array([[0, 0]])]
    assert solve_binned(weights, [np.array([5.0, 1.0]), np.array([2.0, np.inf])], 1).tolist() == [[1, 0]]
    with pytest.raises(ValueError, match=r"group 1 has no option within the loss budget 0\.5"):
        solve_binned([np.array([[0]]), np.array([[3, 4]])], [np.array([1.0]), np.array([1.0, 1.0])], 2, budget=0.5)

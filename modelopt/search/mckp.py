"""Multiple-choice knapsack by dynamic programming: one option per group, least total cost, total loss in a budget.

Two searches solve it, with one DP (`solve_binned`, exact once losses are whole bins):
`knapsack` solves one instance per loss budget it tries (`solve_mckp`, each loss rounded to
the nearest bin), MCTS a batch of Thompson-sampled instances per rollout (losses rounded up,
so each draw's plan fits its draw's budget).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

Table = Sequence[Sequence[float]] | Sequence[np.ndarray]  # per group, a value per option


def solve_mckp(losses: Table, costs: Table, budget: float, bins: int = 2000) -> list[int]:
    """Multiple-choice knapsack: one option per group, least total cost, total loss <= budget.

    Exact dynamic programming over the loss axis cut into `bins` steps of budget/bins;
    each loss is rounded to the nearest step, so with G groups the answer's true loss is
    within G * step / 2 of the budget (usually far less: the roundings cancel), and it is
    exactly optimal when the losses lie on the grid. Rounding up instead would guarantee
    the budget but tax every group half a step on average, which adds up over hundreds of
    layers. Options with infinite loss are never picked; each group needs an option of
    zero loss (its float option) unless the budget is large enough. Ties go to the lower index.

    Args:
        losses: per group, the loss of each option.
        costs: per group, the cost of each option.
        budget: the allowed total loss.
        bins: resolution of the loss axis.

    Example:
        >>> solve_mckp([[0, .004, .01], [0, .002, .008]], [[4, 1, .5], [4, 1, .5]], budget=.01)
        [1, 1]
    """
    groups = [(np.asarray(ls, dtype=float), np.asarray(cs, dtype=float)) for ls, cs in zip(losses, costs, strict=True)]
    if budget >= sum(float(ls[np.isfinite(ls)].max(initial=0.0)) for ls, _ in groups):
        # Every finite option fits together: the unconstrained minimum per group.
        return [_argmin_allowed(cs, np.isfinite(ls)) for ls, cs in groups]
    if budget <= 1e-12:  # (a subnormal budget would overflow the bin arithmetic below)
        return [_argmin_allowed(cs, ls <= 0.0) for ls, cs in groups]
    cap = int(bins)
    step = budget / cap
    weights = []
    for loss, _ in groups:
        w = np.full(loss.shape, cap + 1, dtype=np.int64)  # infinite loss: never fits
        fin = np.isfinite(loss)
        w[fin] = np.rint(np.maximum(loss[fin], 0.0) / step).clip(0, cap + 1)
        weights.append(w[None, :])
    picks = solve_binned(weights, [cost for _, cost in groups], cap, budget=budget)
    return [int(o) for o in picks[0]]


def solve_binned(weights: Sequence[np.ndarray], costs: Sequence[np.ndarray], cap: int, *,
                 budget: float | None = None) -> np.ndarray:
    """The exact DP for R instances at once that share their costs, losses already in whole bins.

    Args:
        weights: per group, (R x options) non-negative integer losses, in bins.
        costs: per group, each option's cost (inf: never picked).
        cap: the loss budget, in bins.
        budget: the budget `cap` cuts, for the message when a group has no option that fits
            (then ValueError); None: no check, for instances that always have a loss-free option.

    Returns:
        (R x groups) the option picked per group, the lower index on ties.
    """
    n = len(weights[0]) if weights else 1
    rows, cols = np.arange(n)[:, None], np.arange(cap + 1)
    best = np.zeros((n, cap + 1))  # best[r, b]: least cost of the groups so far with loss <= b bins
    picks = []
    for g, (w, cost) in enumerate(zip(weights, costs, strict=True)):
        src = cols[None, None, :] - w[:, :, None]  # (R, options, bins + 1): where each option comes from
        cand = best[rows[:, :, None], np.maximum(src, 0)] + cost[None, :, None]
        cand[src < 0] = np.inf
        arg = cand.argmin(axis=1)  # first minimum: the lower option index wins ties
        best = cand[rows, arg, cols]
        if budget is not None and not np.isfinite(best[:, cap]).all():
            raise ValueError(f"group {g} has no option within the loss budget {budget!r}")
        picks.append(arg)
    out = np.zeros((n, len(weights)), dtype=int)
    b = np.full(n, cap)
    for g in range(len(weights) - 1, -1, -1):
        j = picks[g][rows[:, 0], b]
        out[:, g] = j
        b = b - weights[g][rows[:, 0], j]
    return out


def _argmin_allowed(cost: np.ndarray, allowed: np.ndarray) -> int:
    if not allowed.any():
        raise ValueError("a group has no option within the loss budget")
    return int(np.argmin(np.where(allowed, cost, np.inf)))

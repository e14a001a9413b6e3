"""MCTS's rollout: complete a partial plan with the cheapest choices whose (sampled) losses fit the allowed loss.

Each draw is a multiple-choice knapsack solved exactly by dynamic programming over a discretised loss axis
(`modelopt.search.mckp`), all draws at once; the tree (`modelopt.search.mcts`) samples the losses from its loss
model's posterior (Thompson sampling) and says how much loss is allowed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from modelopt.evaluation.cost import CostModel
from modelopt.objective import Objective, Target
from modelopt.plan.space import SearchSpace
from modelopt.search.mckp import solve_binned

__all__ = ["DP_BINS", "MAX_EXITS", "cap_exits", "choice_costs", "complete", "neighbour"]

DP_BINS = 160
# Exits a rollout may turn on. An image leaves at one exit only, but the additive cost and loss models price each
# exit as if it alone were on: rollouts turned on most exits, every plan infeasible (docs/search.md#measured), and
# with all of them always on together no trial could tell their losses apart.
MAX_EXITS = 2


def complete(prefix: tuple[int, ...], deltas: np.ndarray, allowed: np.ndarray, order: Sequence[int],
             costmat: np.ndarray, exits: Sequence[int]) -> np.ndarray:
    """Completions of `prefix`, one per draw: (draws x decisions) choice indices.

    Args:
        prefix: the choices of the first len(prefix) decisions in `order` (the tree's path).
        deltas: (draws, decisions, choices) each choice's loss, one sample per draw.
        allowed: (draws,) the loss each draw may spend.
        order: the decisions in the tree's order (impact order).
        costmat: (decisions, choices) each choice's cost; padding is inf (never chosen).
        exits: the decisions that are early exits (at most `MAX_EXITS` on beyond the prefix's).
    """
    draws, n_dec = deltas.shape[0], deltas.shape[1]
    idx = np.zeros((draws, n_dec), dtype=int)
    fixed = [order[d] for d in range(len(prefix))]
    idx[:, fixed] = prefix
    used = deltas[:, fixed, list(prefix)].sum(axis=1) if prefix else np.zeros(draws)
    rest = list(order[len(prefix):])
    budget = allowed - used
    if not rest:
        return idx
    over = budget <= 0  # the prefix alone spends the loss: finish with the least lossy choices
    if over.any():
        idx[np.ix_(over, np.asarray(rest))] = np.argmin(deltas[over][:, rest] + 1e-12 * costmat[rest], axis=2)
    live = np.flatnonzero(~over)
    if live.size == 0:
        return cap_exits(idx, exits, set(fixed), costmat)
    step = (budget[live] / DP_BINS)[:, None]  # (R', 1)
    d = deltas[live]
    # Losses rounded up to whole bins (within 1e-9 of an edge counts as on it): each draw's plan fits.
    weights = [np.ceil(d[:, i, :] / step - 1e-9).astype(int) for i in rest]
    idx[np.ix_(live, np.asarray(rest))] = solve_binned(weights, [costmat[i] for i in rest], DP_BINS)
    return cap_exits(idx, exits, set(fixed), costmat)


def cap_exits(idx: np.ndarray, exits: Sequence[int], tree: set[int], costmat: np.ndarray) -> np.ndarray:
    """Each row with at most `MAX_EXITS` exits on beyond those the decisions in `tree` set: the ones priced
    cheapest stay, the others are turned off (choice 0: off). Rows are changed in place."""
    if len(exits) <= MAX_EXITS:
        return idx
    for row in idx:
        free = [i for i in exits if row[i] != 0 and i not in tree]
        room = MAX_EXITS - sum(1 for i in exits if row[i] != 0 and i in tree)
        if len(free) > max(room, 0):
            for i in sorted(free, key=lambda i: costmat[i, row[i]])[max(room, 0):]:
                row[i] = 0
    return idx


def neighbour(idx: Sequence[int], rest: Sequence[int], menus: Sequence[int], exits: Sequence[int], tree: set[int],
              costmat: np.ndarray, rng: np.random.Generator, tries: int, taken: Callable[[str], bool],
              key: Callable[[list[int]], str]) -> list[int] | None:
    """A plan near `idx` whose `key` is not `taken`: one decision of `rest` changed at random, then (after `tries`
    tries) two, ...; None after 4 x `tries`. (A uniformly random plan instead turns on half of every menu at once,
    never feasible with exits and pruning offered: docs/search.md#measured.)

    Args:
        menus: each decision's number of choices; exits, tree, costmat: as `cap_exits` takes them.
    """
    for attempt in range(4 * tries):
        new = list(idx)
        for i in rng.choice(rest, size=min(1 + attempt // tries, len(rest)), replace=False):
            new[i] = int(rng.integers(menus[i]))
        new = [int(j) for j in cap_exits(np.array([new]), exits, tree, costmat)[0]]
        if not taken(key(new)):
            return new
    return None


def choice_costs(space: SearchSpace, objective: Objective) -> tuple[list[np.ndarray], np.ndarray]:
    """Each decision's choices priced in the objective's units (bytes priced around the INT4 anchor, where pruning
    saves quantized bytes: `CostModel.marginal_bytes`), and the same as a matrix, decisions x widest menu, padded
    with costs never affordable: what a rollout's knapsack reads."""
    decisions = space.decisions
    cost = [np.array([_cost_of(f, objective) for f in space.features[d.name]], dtype=float) for d in decisions]
    if objective.target is Target.SIZE:
        anchors = space.anchors()
        center = (*anchors, space.plan())[min(1, len(anchors) - 1)]  # INT4, else INT8, else none
        cost = [np.array(c, dtype=float) for c in CostModel(space).marginal_bytes(center)]
    costmat = np.full((len(decisions), max(len(d.choices) for d in decisions)), np.inf)
    for i in range(len(decisions)):
        costmat[i, : len(cost[i])] = cost[i]
    return cost, costmat


def _cost_of(f: Any, objective: Objective) -> float:
    if objective.target is Target.LATENCY and math.isfinite(f.latency):
        return float(f.latency)  # the latency model's estimate (modelopt.latency.cost_model)
    if objective.target is Target.BITOPS:
        return float(f.macs * f.bits * f.act_bits)
    if objective.target is Target.MACS:
        return float(f.macs)
    return float(f.bytes)

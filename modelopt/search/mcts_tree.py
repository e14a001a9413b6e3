"""What MCTS keeps per tree node and per told trial, and what a told trial is worth (`modelopt.search.mcts`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from modelopt.evaluation.trial import Trial
from modelopt.objective import Objective

__all__ = ["MAX_WEIGHT", "Node", "Record", "Tree", "norm_value", "trial_value", "trial_weight"]

MAX_WEIGHT = 0.5  # share of the best-below value in a node's value (the rest is the mean)


@dataclass
class Node:
    """A partial plan's statistics: visits, summed and best value below it, visits in flight, children's prior."""

    n: int = 0
    w: float = 0.0
    best: float = 0.0
    virtual: int = 0
    prior: list[float] | None = None  # children's prior, computed with the model of `prior_at` trials
    prior_at: int = 0

    def q(self, lo: float, hi: float) -> float:
        """Normalised value; a pending (virtual) visit counts as the lowest value."""
        visits = self.n + self.virtual
        if visits == 0:
            return 0.0
        raw = (1 - MAX_WEIGHT) * (self.w + self.virtual * lo) / visits + MAX_WEIGHT * self.best
        return norm_value(raw, lo, hi)


def norm_value(raw: float, lo: float, hi: float) -> float:
    """`raw` placed in [0, 1] between `lo` (the median value so far) and `hi` (the best)."""
    return min(max((raw - lo) / (hi - lo), 0.0), 1.0) if hi > lo else 0.5


@dataclass
class Record:
    """A told trial as the search keeps it."""

    idx: list[int]  # choice index per decision (space order)
    retention: float | None  # None: failed
    value: float
    weight: float = 1.0  # share of the val split scored (multi-fidelity): noise variance ~ 1 / weight


class Tree(dict[tuple[int, ...], Node]):
    """The search tree: a node per partial plan (its choice indices, decisions in impact order), and RAVE's
    all-moves-as-first statistics per decision and choice: plans told that chose it (`amaf_n`), their summed value
    (`amaf_w`)."""

    def __init__(self, choices: Sequence[int], nodes: Mapping[tuple[int, ...], Node] | None = None) -> None:
        super().__init__({(): Node()} if nodes is None else nodes)
        self.amaf_n = [np.zeros(c) for c in choices]
        self.amaf_w = [np.zeros(c) for c in choices]

    def walk(self, path: tuple[int, ...], fn: Callable[[Node], object]) -> None:
        """`fn` on every node from the root down to `path` (added where missing)."""
        for depth in range(len(path) + 1):
            fn(self.setdefault(path[:depth], Node()))

    def backup(self, path: tuple[int, ...], value: float) -> None:
        """A plan's value counted at every node from the root down to `path`."""
        for depth in range(len(path) + 1):
            node = self.setdefault(path[:depth], Node())
            node.n, node.w, node.best = node.n + 1, node.w + value, max(node.best, value)

    def amaf(self, idx: Sequence[int], value: float) -> None:
        """A plan's value counted for each of its choices (`idx`: choice index per decision, space order)."""
        for i, j in enumerate(idx):
            self.amaf_n[i][j], self.amaf_w[i][j] = self.amaf_n[i][j] + 1, self.amaf_w[i][j] + value

    def deepest(self, idx: Sequence[int], order: Sequence[int]) -> tuple[int, ...]:
        """The deepest path in the tree that a plan's choices (`idx`) follow, decisions in `order`."""
        path: tuple[int, ...] = ()
        for i in order:
            if (*path, idx[i]) not in self:
                break
            path = (*path, idx[i])
        return path


def trial_value(trial: Trial, objective: Objective) -> float:
    """A told trial's value to the tree: above 1 when it meets the floor (growing with its reward), else below 1 by
    how far its retention falls short; 0 for a failed trial."""
    if trial.reward is None or trial.metrics is None:
        return 0.0
    if trial.meets_floor:
        return 1.0 + math.log(max(trial.reward, 1.0))
    ratio = max(0.0, min(objective.point_retention(trial.metrics) / max(objective.min_retention, 1e-9), 1.0))
    return 0.99 * ratio**8


def trial_weight(trial: Trial) -> float:
    """The share of the val split a trial was scored on (1 unless multi-fidelity stopped it)."""
    m = trial.metrics
    if m is None or m.stopped is None or trial.cost <= 0:
        return 1.0
    return float(min(max(trial.cost, 0.05), 1.0))

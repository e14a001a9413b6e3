"""What MCTS keeps per tree node and per told trial (`modelopt.search.mcts`)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MAX_WEIGHT", "Node", "Record", "norm_value"]

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

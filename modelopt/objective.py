"""What the search minimises, under a floor on accuracy retention, and the Pareto front."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import TypeVar

from modelopt.errors import ConfigError
from modelopt.metrics import Metrics


class Target(str, Enum):
    SIZE = "size"
    BITOPS = "bitops"
    MACS = "macs"
    LATENCY = "latency"  # measured per plan (modelopt.plan_latency), in ms


@dataclass(frozen=True)
class Objective:
    """Minimise `target` subject to retention >= `min_retention`.

    The reward is the reduction factor on the target (float value / plan value)
    when feasible, always >= 0 for a plan no larger than float; an infeasible plan
    scores retention - min_retention - 1, below every feasible one.

    Example:
        >>> Objective("size", min_retention=0.99).reward(metrics)
    """

    target: Target = Target.SIZE
    min_retention: float = 0.99

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "target", Target(self.target))
        except ValueError:
            valid = ", ".join(t.value for t in Target)
            raise ConfigError(f"unknown objective {self.target!r}; valid: {valid}") from None
        if not 0.0 <= self.min_retention <= 1.5:
            raise ConfigError(f"min_retention must be a fraction like 0.99, got {self.min_retention!r}")

    def value(self, m: Metrics) -> float:
        if self.target is Target.LATENCY:
            return math.inf if m.latency_ms is None else float(m.latency_ms)
        return float({Target.SIZE: m.size_bytes, Target.BITOPS: m.bitops, Target.MACS: m.macs}[self.target])

    def reference(self, m: Metrics) -> float:
        """The uncompressed model's value of the target."""
        ref = {Target.SIZE: m.float_size_bytes, Target.BITOPS: m.float_bitops or m.macs * 32 * 32,
               Target.MACS: m.float_macs or m.macs, Target.LATENCY: m.float_latency_ms or math.nan}
        return float(ref[self.target])

    def meets_floor(self, m: Metrics) -> bool:
        """Retention at or above the floor, on whatever samples `m` was scored."""
        return not math.isnan(m.retention) and m.retention >= self.min_retention

    def feasible(self, m: Metrics) -> bool:
        """Meets the floor on the whole split: a plan scored only on a subset never counts."""
        return m.stopped is None and self.meets_floor(m)

    def reward(self, m: Metrics) -> float:
        """What strategies maximise; for a plan scored on a subset, its estimate from that subset."""
        if self.meets_floor(m):
            return self.reference(m) / max(self.value(m), 1e-12)
        r = 0.0 if math.isnan(m.retention) else m.retention
        return r - self.min_retention - 1.0


T = TypeVar("T")


def pareto_front(items: Iterable[T], key: Callable[[T], Metrics], objective: Objective) -> list[T]:
    """Items not dominated in (higher retention, lower target value), by ascending target value."""
    # NaN retention is never on the front, and left in the sort it can misorder equal-size items.
    # Plans scored only on a subset (multi-fidelity) are left out: their retention is an estimate.
    pts = sorted((it for it in items if not math.isnan(key(it).retention) and key(it).stopped is None),
                 key=lambda it: (objective.value(key(it)), -key(it).retention))
    front: list[T] = []
    best_ret = -math.inf
    for it in pts:
        r = key(it).retention
        if r > best_ret:
            front.append(it)
            best_ret = r
    return front


def best_of(items: Sequence[T], key: Callable[[T], Metrics], objective: Objective) -> T | None:
    """The feasible item with the highest reward (ties: higher retention), or None."""
    feasible = [it for it in items if objective.feasible(key(it))]
    if not feasible:
        return None
    return max(feasible, key=lambda it: (objective.reward(key(it)), key(it).retention))

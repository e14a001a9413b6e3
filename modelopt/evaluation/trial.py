"""The frozen record of one trial: plan, what it measured, what it cost."""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from typing import Any

from modelopt.evaluation.metrics import Metrics
from modelopt.plan.plan import Plan
from modelopt.plan.space import SearchSpace

TRIAL_VERSION = 1


class TrialStatus(str, Enum):
    COMPLETE = "complete"
    FAILED = "failed"  # crashed or gave non-finite outputs; the search goes on


@dataclass(frozen=True)
class Trial:
    """One pass of the loop. `reward` is None for a failed trial."""

    number: int
    plan: Plan
    status: TrialStatus
    metrics: Metrics | None
    reward: float | None
    feasible: bool
    cost: float  # budget charged, in full-evaluation equivalents
    seconds: float  # wall time of the evaluation
    strategy: str
    seed: int
    version: str
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status is TrialStatus.COMPLETE

    @property
    def scored(self) -> Metrics:
        """The metrics of a trial that completed (check `ok` first: a failed one raises)."""
        if self.metrics is None:
            raise ValueError(f"trial {self.number} failed ({self.error}); it has no metrics")
        return self.metrics

    @property
    def meets_floor(self) -> bool:
        """Retention at the floor on what was scored; unlike `feasible`, also for a plan that
        multi-fidelity stopped on a subset (strategies learn from this, reports use `feasible`)."""
        return self.ok and self.reward is not None and self.reward >= 0

    def to_json(self) -> dict[str, Any]:
        return {
            "v": TRIAL_VERSION,
            "number": self.number,
            "plan_key": self.plan.key,
            "plan": self.plan.to_flat(),
            "status": self.status.value,
            "metrics": None if self.metrics is None else self.metrics.to_dict(),
            "reward": None if self.reward is None or math.isnan(self.reward) else self.reward,
            "feasible": self.feasible,
            "cost": self.cost,
            "seconds": self.seconds,
            "strategy": self.strategy,
            "seed": self.seed,
            "version": self.version,
            "error": self.error,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any], space: SearchSpace) -> Trial:
        return cls(
            number=int(d["number"]),
            plan=space.plan_from_flat(d["plan"]),
            status=TrialStatus(d["status"]),
            metrics=None if d.get("metrics") is None else Metrics.from_dict(d["metrics"]),
            reward=d.get("reward"),
            feasible=bool(d.get("feasible", False)),
            cost=float(d.get("cost", 0.0)),
            seconds=float(d.get("seconds", 0.0)),
            strategy=str(d.get("strategy", "")),
            seed=int(d.get("seed", 0)),
            version=str(d.get("version", "")),
            error=d.get("error"),
        )

"""The frozen record of one trial: plan, what it measured, what it cost. (Its journal line is
`modelopt.run.journal.Record`.)"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from modelopt.evaluation.metrics import Metrics
from modelopt.plan.plan import Plan


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

"""The executor seam: who scores the plans a run's driver asks for.

The driver (`modelopt.run.runner.Runner`) keeps the strategy, the journal and the budget; an
executor only scores. `submit` hands it a `Job`; `wait` blocks until at least one submitted job
is scored and returns what was. Executors may finish jobs in any order: the driver records them
in the order they were asked (`Job.seq`), so a run's trials do not depend on timing.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from modelopt.evaluation.metrics import Metrics
from modelopt.plan.plan import Plan

__all__ = ["Executor", "Job", "Scored"]


@dataclass(frozen=True)
class Job:
    """One plan to score. `seq`: its place in the run's ask order; `finish`: under multi-fidelity,
    score it to the end even when it cannot beat the best so far (decided by the driver)."""

    seq: int
    plan: Plan
    finish: bool = True


@dataclass(frozen=True)
class Scored:
    """What scoring a plan gave, before the run charges and judges it.

    `metrics` is None when scoring raised (`error` says what). `charges`: the one-time preparations
    a worker charged this plan in full, for the driver to settle (`Evaluator.settle`); None when
    the driver's own evaluator scored it and already charged them.
    """

    metrics: Metrics | None
    seconds: float
    error: str | None = None
    charges: Mapping[str, float] | None = None


class Executor(ABC):
    """Scores jobs for a run. `slots`: how many plans the driver keeps in flight."""

    name: ClassVar[str]
    slots: int

    @abstractmethod
    def submit(self, job: Job) -> None:
        """Queues `job`; it is scored when a worker is free."""

    @abstractmethod
    def wait(self) -> list[tuple[Job, Scored]]:
        """Blocks until a submitted job is scored (or given up on); returns every job done since the
        last call, possibly none when only a worker was lost (its job is then queued again)."""

    def close(self) -> None:  # noqa: B027 -- optional: an executor without workers has nothing to free
        """Frees the workers (the run is over, or failed); may be called more than once."""

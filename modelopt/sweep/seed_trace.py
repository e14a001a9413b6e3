"""One sweep cell read back for its table: its best-so-far trace along the budget and what its run reported.

A `SeedTrace` is read from the run folder alone (run.json, the journal, summary.json when the run finished): the
sweep table (`modelopt.sweep.table`) takes each budget's plan from it, and the markdown writer
(`modelopt.sweep.table_md`) the budget each strategy needed.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

from modelopt.config.run_config import RunConfig
from modelopt.objective import Objective, best_of
from modelopt.run.journal import Record, read_records
from modelopt.run.layout import CONFIG, JOURNAL
from modelopt.run.reported import PlanEntry
from modelopt.run.summary import RunSummary, read_summary
from modelopt.sweep.cells import EPS

__all__ = ["SeedTrace", "read_seed", "reduction"]


@dataclass
class SeedTrace:
    """One cell read back: its best-so-far trace and the plans the table needs."""

    seed: int
    config: RunConfig
    objective: Objective
    trace: list[tuple[float, Record | None]]  # (cumulative cost, best feasible record so far)
    covered: float  # the largest budget this cell's trace answers for
    records: list[tuple[float, Record]]  # (cumulative cost, record) of every journal line
    run_dir: Path
    # What the run itself reported (summary.json; None when the run wrote none). At the run's own budget the table
    # states its record of the best plan, replaying nothing.
    summary: RunSummary | None = None

    @property
    def budget(self) -> float:
        """The run's own budget (summary.json; inf without one)."""
        return math.inf if self.summary is None else self.summary.budget

    def own(self, budget: float) -> bool:
        """Whether `budget` is the run's own (or more): the table then states what the run reported."""
        return self.summary is not None and budget >= self.budget - EPS

    def reported(self) -> PlanEntry | None:
        """The record of the plan the run reported (None: none, or no summary)."""
        return None if self.summary is None else self.summary.best

    def records_within(self, budget: float) -> list[Record]:
        return [rec for cost, rec in self.records if cost <= budget + EPS]

    def best_within(self, budget: float) -> Record | None:
        best = None
        for cost, rec in self.trace:
            if cost > budget + EPS:
                break
            best = rec
        return best

    def reaches(self, target: float, limit: float) -> float:
        """The cumulative cost at which the best-so-far reduction first reaches `target` (inf: never)."""
        for cost, rec in self.trace:
            if cost > limit + EPS:
                break
            if rec is not None and reduction(self.objective, rec) >= target * (1 - 1e-12):
                return cost
        return math.inf


def reduction(obj: Objective, rec: Record) -> float:
    """The search's reward of a journal line: its reduction when it is feasible (a search-time val figure)."""
    return obj.reward(rec.scored)


def read_seed(run_dir: Path, seed: int) -> SeedTrace | None:
    """The cell in `run_dir`, or None before its run.json is written."""
    if not (run_dir / CONFIG).is_file():
        return None
    config, summary = RunConfig.read(run_dir), read_summary(run_dir)
    obj = dataclasses.replace(config.make_objective(), claim_images=None if summary is None else
                              summary.objective.claim_images)  # the search's bound as the run took it
    trace: list[tuple[float, Record | None]] = []
    records: list[tuple[float, Record]] = []
    cum, best = 0.0, None
    for rec in read_records(run_dir / JOURNAL):
        cum += rec.cost
        records.append((cum, rec))
        if rec.ok:
            # The runner's rule (best_of): the best so far stays unless this one beats it.
            best = best_of([r for r in (best, rec) if r is not None], lambda r: r.scored, obj)
        trace.append((cum, best))
    # A run that stopped early (nothing new to propose) covers its whole budget.
    covered = max(cum, summary.budget if summary else 0.0)
    return SeedTrace(seed, config, obj, trace, covered, records, run_dir, summary)

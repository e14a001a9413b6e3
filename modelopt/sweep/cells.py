"""A sweep's cells: one run folder each, and how far it got (read from the folder alone)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from modelopt.run.journal import read_records
from modelopt.run.layout import CONFIG, JOURNAL
from modelopt.run.summary import read_summary

__all__ = ["EPS", "Cell", "cell_status"]

EPS = 1e-9  # budgets are sums of float costs

@dataclass(frozen=True)
class Cell:
    """One run of the grid and how far it got."""

    model: str
    strategy: str
    seed: int
    run_dir: Path
    n_trials: int
    spent: float
    done: bool  # summary.json written and the budget reached (or the space exhausted at it)

    @property
    def started(self) -> bool:
        return (self.run_dir / CONFIG).exists() or (self.run_dir / JOURNAL).exists()

    @property
    def status(self) -> str:
        return "done" if self.done else "partial" if self.started else "todo"


def cell_status(run_dir: Path, model: str, strategy: str, seed: int, budget: float) -> Cell:
    """A cell is done when its summary exists and its trials' cost reaches `budget`, or its run
    stopped early at that budget because the strategy had nothing new to propose (a run Ctrl-C stopped before its
    budget is partial)."""
    records = read_records(run_dir / JOURNAL)
    spent = sum(r.cost for r in records)
    summary = read_summary(run_dir)
    done = summary is not None and (spent >= budget - EPS or (not summary.stopped and summary.budget >= budget - EPS))
    return Cell(model, strategy, seed, run_dir, len(records), spent, done)

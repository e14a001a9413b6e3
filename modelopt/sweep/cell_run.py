"""One cell of a sweep run (or resumed) through the API, how it went (`Outcome`), and the lines the progress bar
says as each cell ends (`Done`); `modelopt.sweep.run` runs the cells here, `modelopt.sweep.on_ray` on Ray."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from rich.progress import Progress, TaskID

from modelopt.api import build_workload, optimize
from modelopt.errors import ConfigError, ModeloptError
from modelopt.model.workload import Workload
from modelopt.run.runner import free_cuda_memory
from modelopt.sweep.file import Cell, Sweep, SweepModel

__all__ = ["Done", "Outcome", "cell_name", "model_workload", "run_cell"]


def model_workload(model: SweepModel, device: str) -> Workload:
    """The workload of one of the sweep's models (each cell of it runs on this)."""
    return build_workload(model.model, model.data, weights=model.weights, device=device, unlabeled=model.unlabeled)


def cell_name(cell: Cell) -> str:
    """How progress lines and `--only` name a cell: model/strategy/seedK."""
    return f"{cell.model}/{cell.strategy}/seed{cell.seed}"


@dataclass(frozen=True)
class Outcome:
    """How a cell went, in words: what it found, or why it failed (its journal is kept either way)."""

    ok: bool
    text: str
    stops: type[ModeloptError] | None = None  # what stops the serial sweep: bad settings, a model that won't load


@dataclass(frozen=True)
class Done:
    """The progress bar of cells done, and the lines said as each cell ends."""

    bar: Progress
    task: TaskID
    progress: bool

    def say(self, cell: Cell, outcome: Outcome) -> None:
        if not outcome.ok:
            self.bar.console.print(f"[red]{cell_name(cell)} failed:[/] {outcome.text}; rerun the sweep to retry it",
                                   highlight=False)
        elif self.progress:
            self.bar.console.print(f"{cell_name(cell)}: {outcome.text}", highlight=False)
        self.bar.advance(self.task)

    def doing(self, what: str) -> None:
        self.bar.update(self.task, description=what)


def run_cell(sweep: Sweep, model: SweepModel, cell: Cell, wl: Workload, ray_address: str | None) -> Outcome:
    """Runs (or resumes) one cell through the API and says how it went; a ConfigError (the sweep's settings
    are wrong, so every cell would fail alike) stops the sweep."""
    spread: dict[str, Any] = {}
    if sweep.workers_per_cell > 1:  # the run's own evaluations fanned over Ray workers
        spread = {"workers": sweep.workers_per_cell, "ray_address": ray_address}
    try:
        result = optimize(
            wl, out=cell.run_dir, resume=cell.started, progress=False, **{
                **sweep.settings, "strategy": cell.strategy, "budget": sweep.budget, "seed": cell.seed,
                "weights": model.weights, "unlabeled": model.unlabeled, **spread})
    except Exception as exc:  # one broken cell must not stop the grid; its journal is kept
        if isinstance(exc, ConfigError):
            raise
        failed = Outcome(False, f"{type(exc).__name__}: {exc}")
        out_of_memory = isinstance(exc, torch.cuda.OutOfMemoryError)
    else:
        if result.stopped:  # Ctrl-C stopped the cell's search (it certified what it had): it stops the sweep too
            raise KeyboardInterrupt
        best = result.best
        found = "no feasible plan" if best is None else (
            f"best {best.scored.compression:.2f}x at {best.scored.retention:.2%} val retention")
        return Outcome(True, f"{len(result.trials)} trials, {found}")
    if out_of_memory:  # past the except clause, whose traceback held the cell's tensors
        free_cuda_memory()
    return failed

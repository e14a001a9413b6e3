"""Sweeps: every model × strategy × seed run once at the largest budget, then one table from the run folders.

A sweep file (YAML) names the grid:

```yaml
name: mcts_vs_baselines
out: mcts_vs_baselines          # results folder; relative paths are resolved against this file's folder
models:
  - {name: resnet20, model: cifar10_resnet20}
  - {name: resnet56, model: cifar10_resnet56, weights: ../../shared/models/cifar10/resnet56-4bfd9763.th}
strategies: [random, mcts]
budgets: [50, 100, 200]         # every cell runs at 200; 50 and 100 are read from its best-so-far trace
seeds: [0, 1, 2, 3, 4]
objective: size                 # size | bitops | macs
min_retention: 0.99
bits: [8, 4]
granularity: [per_channel, group]
rounding: [gptq]                # optional: gptq | nearest, or both for the search to choose
device: auto                    # optional
```

Each cell is an ordinary run folder, `<out>/runs/<model>/<strategy>/seed<k>`, so a killed sweep
resumes cell by cell. The table (`table.md`, `table.csv`, and `table_seeds.csv` with the
per-seed values behind it) is computed by `make_table(out)` from the journals alone, with
each chosen plan re-scored on the test split.
"""
from __future__ import annotations

import fnmatch
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from modelopt.api import build_workload, optimize
from modelopt.config import RunConfig
from modelopt.errors import ConfigError
from modelopt.reports import write_sweep_report
from modelopt.run.journal import write_json_atomic
from modelopt.run.layout import CONFIG, SWEEP_JSON, TABLE_CSV, TABLE_MD
from modelopt.run.runner import free_cuda_memory
from modelopt.sweep.file import Cell, Sweep, SweepModel, load_sweep
from modelopt.sweep.table import make_table
from modelopt.workload import Workload

__all__ = ["SweepResult", "run_sweep"]

# ---- running --------------------------------------------------------------------------------


@dataclass(frozen=True)
class SweepResult:
    """What `run_sweep` did and the table it wrote."""

    sweep: Sweep
    cells: tuple[Cell, ...]  # as found before running
    ran: tuple[Cell, ...]  # the cells this call ran (or resumed)
    rows: tuple[dict[str, Any], ...]  # one per model × strategy × budget, as in table.csv
    markdown: str
    table_md: Path
    table_csv: Path


def _check_started(sweep: Sweep, cells: Sequence[Cell]) -> None:
    """A cell already on disk must have been run with this file's settings, or the table would mix runs."""
    want = {"objective": sweep.objective, "min_retention": sweep.min_retention, "confidence": sweep.confidence,
            "bits": list(dict.fromkeys(sweep.bits)), "granularity": list(dict.fromkeys(sweep.granularity)),
            "rounding": list(dict.fromkeys(sweep.rounding))}
    for cell in cells:
        if not (cell.run_dir / CONFIG).is_file():
            continue
        cfg = RunConfig.read(cell.run_dir)
        quant = cfg.options.get("quantize", {})
        have = {"objective": cfg.objective, "min_retention": cfg.min_retention, "confidence": cfg.confidence,
                "bits": quant.get("bits"), "granularity": quant.get("granularity"),
                "rounding": quant.get("rounding", ["nearest"])}  # a record without it predates gptq
        if sweep.compressors is not None:
            want["compressors"] = sorted(sweep.compressors)
            have["compressors"] = sorted(cfg.compressors or ())
        for key, value in want.items():
            if have[key] != value:
                raise ConfigError(
                    f"run folder {str(cell.run_dir)!r} was run with {key}={have[key]!r} but sweep file "
                    f"{str(sweep.path)!r} says {value!r}; give the sweep another 'out' or delete that folder"
                )


def _build_workload(model: SweepModel, device: str) -> Workload:
    return build_workload(model.model, model.data, weights=model.weights, device=device)


def run_sweep(
    path: str | Path,
    *,
    progress: bool = True,
    console: Console | None = None,
    workloads: Mapping[str, Workload] | None = None,
    only: Sequence[str] = (),
) -> SweepResult:
    """Runs every unfinished cell of a sweep file at its largest budget, then writes the table.

    `only`: shell patterns on `model/strategy/seedK` (e.g. `resnet56/mcts/*`); when given, just
    the matching cells run, in the order of the patterns (the table still covers every cell).

    Finished cells are skipped and partial ones resumed, so rerunning a killed sweep continues it.
    One workload is built per model and shared by its cells.

    Args:
        path: the sweep file (see this module's docstring for the format).
        progress: show cells done / total and the current cell on stderr.
        console: where the progress goes (default: stderr).
        workloads: workloads already built, by the sweep's model names (notebooks, tests); the
            caller vouches that each matches its model entry (model, weights, data, device).

    Returns:
        The cells, the table rows (also in `<out>/table.csv`) and the Markdown (`<out>/table.md`).

    Example:
        >>> result = run_sweep("experiments/smoke.yaml")
        >>> print(result.markdown)
    """
    sweep = load_sweep(path)
    cells = sweep.cells()
    _check_started(sweep, cells)
    sweep.out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(sweep.out / SWEEP_JSON, sweep.to_json())
    console = console or Console(stderr=True)
    workloads = dict(workloads or {})
    ran: list[Cell] = []
    todo = _selected([c for c in cells if not c.done], only)
    columns = (TextColumn("[bold]sweep {task.fields[name]}"), BarColumn(), MofNCompleteColumn(), TextColumn("cells"),
               TimeElapsedColumn(), TextColumn("{task.description}"))
    with Progress(*columns, console=console, disable=not progress) as bar:
        task = bar.add_task("", total=len(cells), completed=len(cells) - len(todo), name=sweep.name)
        for model in sweep.models:
            mine = [c for c in todo if c.model == model.name]
            if not mine:
                continue
            bar.update(task, description=f"loading {model.name}")
            if model.name not in workloads:
                workloads[model.name] = _build_workload(model, sweep.device)
            for cell in mine:
                bar.update(task, description=f"{cell.model}/{cell.strategy}/seed{cell.seed}"
                           + (f" (resuming at {cell.spent:g})" if cell.started else ""))
                if _run_cell(sweep, model, cell, workloads[model.name], bar.console, progress):
                    ran.append(cell)
                bar.advance(task)
        bar.update(task, description="re-scoring the chosen plans on test")
        rows = make_table(sweep.out, workloads=workloads, device=sweep.device)
    _write_sweep_report(sweep.out)
    return SweepResult(sweep, tuple(cells), tuple(ran), tuple(rows), (sweep.out / TABLE_MD).read_text(),
                       sweep.out / TABLE_MD, sweep.out / TABLE_CSV)


def _selected(todo: list[Cell], only: Sequence[str]) -> list[Cell]:
    """The cells matching any of the `only` patterns (on model/strategy/seedK), in the patterns' order."""
    if not only:
        return todo
    label = {id(c): f"{c.model}/{c.strategy}/seed{c.seed}" for c in todo}
    ordered = [c for pattern in only for c in todo if fnmatch.fnmatch(label[id(c)], pattern)]
    return list({id(c): c for c in ordered}.values())


def _run_cell(sweep: Sweep, model: SweepModel, cell: Cell, wl: Workload, console: Console, progress: bool) -> bool:
    """Runs (or resumes) one cell through the API; False when it failed (said on `console`, journal kept)."""
    name = f"{cell.model}/{cell.strategy}/seed{cell.seed}"
    try:
        result = optimize(
            wl, strategy=cell.strategy, budget=sweep.budget, seed=cell.seed, out=cell.run_dir, resume=cell.started,
            objective=sweep.objective, min_retention=sweep.min_retention, confidence=sweep.confidence,
            bits=sweep.bits, granularity=sweep.granularity, rounding=sweep.rounding, compressors=sweep.compressors,
            weights=model.weights, progress=False,
        )
    except Exception as exc:  # one broken cell must not stop the grid; its journal is kept
        if isinstance(exc, ConfigError):
            raise
        console.print(f"[red]{name} failed:[/] {type(exc).__name__}: {exc}; rerun the sweep to retry it",
                      highlight=False)
        out_of_memory = isinstance(exc, torch.cuda.OutOfMemoryError)
    else:
        if progress:
            best = result.best
            found = "no feasible plan" if best is None else (
                f"best {best.scored.compression:.2f}x at {best.scored.retention:.2%} val retention")
            console.print(f"{name}: {len(result.trials)} trials, {found}", highlight=False)
        return True
    if out_of_memory:  # past the except clause, whose traceback held the cell's tensors
        free_cuda_memory()
    return False


def _write_sweep_report(out: Path) -> None:
    """report.md and report.html beside the table: an extra, so a failure warns and the sweep stands."""
    try:
        write_sweep_report(out)
    except Exception as exc:  # noqa: BLE001 -- an extra: whatever breaks it, the sweep stands
        warnings.warn(f"the sweep finished but its report was not written ({type(exc).__name__}: {exc}); "
                      f"retry with `modelopt report {out}`", stacklevel=3)

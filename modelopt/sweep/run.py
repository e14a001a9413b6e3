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
workers_per_cell: 4             # optional: each cell's evaluations fanned over 4 Ray workers, cells in turn
```

Each cell is an ordinary run folder, `<out>/runs/<model>/<strategy>/seed<k>`, so a killed sweep
resumes cell by cell. `run_sweep(..., workers=N)` (`modelopt sweep FILE --workers N`) instead runs
up to N cells at once on Ray, each in its own worker process with its own copy of the workload; the
cells' journals are what the serial sweep writes (wall times aside). The table (`table.md`,
`table.csv`, and `table_seeds.csv` with the per-seed values behind it) is computed by
`make_table(out)` from the journals alone, with each chosen plan re-scored on the test split. One cell's run is
`modelopt.sweep.cell_run`; Ray's part, `modelopt.sweep.on_ray`.
"""
from __future__ import annotations

import fnmatch
import importlib.util
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from modelopt.compressors import COMPRESSORS
from modelopt.config.run_config import MAX_WORKERS, RunConfig
from modelopt.errors import TOO_LARGE, ConfigError, beyond_float
from modelopt.model.workload import Workload
from modelopt.reports import write_sweep_report
from modelopt.run.console import progress_console
from modelopt.run.journal import write_json_atomic
from modelopt.run.layout import CONFIG, SWEEP_JSON, TABLE_CSV, TABLE_MD
from modelopt.sweep.cell_run import Done, cell_name, model_workload, run_cell
from modelopt.sweep.file import Cell, Sweep, load_sweep
from modelopt.sweep.on_ray import RAY_MISSING, one_cluster, run_on_ray
from modelopt.sweep.table import make_table

__all__ = ["SweepResult", "run_sweep"]


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
    """A cell already on disk must have been run with this file's settings, or the table would mix runs: the
    objective, floor and confidence, the compressors when the file names them, and every setting of the
    compressors a cell used (defaults included, each as its compressor records it)."""
    base = sweep.config
    for cell in cells:
        if not (cell.run_dir / CONFIG).is_file():
            continue
        cfg = RunConfig.read(cell.run_dir)
        pairs: list[tuple[str, Any, Any]] = [(k, getattr(cfg, k), getattr(base, k))
                                             for k in ("objective", "min_retention", "confidence")]
        if base.compressors is not None:
            pairs.append(("compressors", sorted(cfg.compressors or ()), sorted(base.compressors)))
        for name in cfg.compressors or ():
            if name in COMPRESSORS:
                cls = COMPRESSORS.get(name)
                # A RunConfig holds every registered compressor's whole record: the fields compare as they are.
                ran, asked = cfg.options[name].to_json(), base.options[name].to_json()  # in run.json's form
                pairs += [(s.option, ran.get(s.option), asked.get(s.option)) for s in cls.record.settings()]
        for key, have, want in pairs:
            if have != want:
                raise ConfigError(
                    f"run folder {str(cell.run_dir)!r} was run with {key}={have!r} but sweep file "
                    f"{str(sweep.path)!r} says {want!r}; give the sweep another 'out' or delete that folder"
                )


def run_sweep(
    path: str | Path,
    *,
    progress: bool = True,
    console: Console | None = None,
    workloads: Mapping[str, Workload] | None = None,
    only: Sequence[str] = (),
    workers: int = 1,
    ray_address: str | None = None,
) -> SweepResult:
    """Runs every unfinished cell of a sweep file at its largest budget, then writes the table.

    `only`: shell patterns on `model/strategy/seedK` (e.g. `resnet56/mcts/*`); when given, just
    the matching cells run, in the order of the patterns (the table still covers every cell).

    Finished cells are skipped and partial ones resumed, so rerunning a killed sweep continues it.
    Run serially, one workload is built per model and shared by its cells; with `workers` > 1 up to
    that many cells run at once as Ray tasks, each loading its own workload.

    Args:
        path: the sweep file (see this module's docstring for the format).
        progress: show cells done / total and the current cell on stderr.
        console: where the progress goes (default: stderr).
        workloads: workloads already built, by the sweep's model names (notebooks, tests); the
            caller vouches that each matches its model entry (model, weights, data, device).
        workers: cells run at once on Ray (needs `modelopt[distributed]`); 1: one after another here.
        ray_address: a running Ray cluster to use (default: a local one started for the sweep).

    Returns:
        The cells, the table rows (also in `<out>/table.csv`) and the Markdown (`<out>/table.md`).

    Example:
        >>> result = run_sweep("experiments/smoke.yaml", workers=2)
        >>> print(result.markdown)
    """
    sweep = load_sweep(path)
    check_selection(sweep, only, workers)
    cells = sweep.cells()
    _check_started(sweep, cells)
    sweep.out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(sweep.out / SWEEP_JSON, sweep.to_json())
    console = console or progress_console()
    workloads = dict(workloads or {})
    todo = _selected([c for c in cells if not c.done], only)
    columns = (TextColumn("[bold]sweep {task.fields[name]}"), BarColumn(), MofNCompleteColumn(), TextColumn("cells"),
               TimeElapsedColumn(), TextColumn("{task.description}"))
    with Progress(*columns, console=console, disable=not progress) as bar:
        task = bar.add_task("", total=len(cells), completed=len(cells) - len(todo), name=sweep.name)
        done = Done(bar, task, progress)
        if workers > 1 and todo:
            ran = run_on_ray(sweep, todo, workers, ray_address, workloads, done)
        else:
            with one_cluster(sweep, todo, ray_address):
                ran = _run_here(sweep, todo, workloads, ray_address, done)
        bar.update(task, description="re-scoring the chosen plans on test")
        rows = make_table(sweep.out, workloads=workloads, device=sweep.device)
    _write_sweep_report(sweep.out)
    return SweepResult(sweep, tuple(cells), tuple(ran), tuple(rows), (sweep.out / TABLE_MD).read_text(),
                       sweep.out / TABLE_MD, sweep.out / TABLE_CSV)


def check_selection(sweep: Sweep, only: Sequence[str] = (), workers: int = 1) -> None:
    """Refuses, before any work (and on a dry run), a count of cells at once that cannot run and an `only` pattern
    that matches no cell of the sweep (it would run nothing, silently)."""
    _check_workers(workers)
    if workers > 1 and sweep.workers_per_cell > 1:
        raise ConfigError(f"--workers {workers} runs cells at once, but sweep file {str(sweep.path)!r} asks for "
                          f"workers_per_cell: {sweep.workers_per_cell} (cells in turn); use one of the two")
    names = [cell_name(c) for c in sweep.cells()]
    for pattern in only:
        if not any(fnmatch.fnmatch(name, pattern) for name in names):
            raise ConfigError(f"--only {pattern!r} matches no cell of sweep {sweep.name!r}; cells are named "
                              f"model/strategy/seedK: {', '.join(names[:4])}{', ...' if len(names) > 4 else ''}")


def _check_workers(workers: int) -> None:
    """Before any work: a count of cells at once that makes sense, and Ray installed when it is needed."""
    if not isinstance(workers, int) or isinstance(workers, bool) or not 1 <= workers <= MAX_WORKERS:
        shown = TOO_LARGE if isinstance(workers, int) and beyond_float(workers) else repr(workers)
        raise ConfigError(f"--workers must be a number of cells run at once from 1 to {MAX_WORKERS}, like 2; got "
                          f"{shown}")
    if workers > 1 and importlib.util.find_spec("ray") is None:
        raise ConfigError(RAY_MISSING)


def _selected(todo: list[Cell], only: Sequence[str]) -> list[Cell]:
    """The cells matching any of the `only` patterns (on model/strategy/seedK), in the patterns' order."""
    if not only:
        return todo
    label = {id(c): cell_name(c) for c in todo}
    ordered = [c for pattern in only for c in todo if fnmatch.fnmatch(label[id(c)], pattern)]
    return list({id(c): c for c in ordered}.values())


def _run_here(sweep: Sweep, todo: Sequence[Cell], workloads: dict[str, Workload], ray_address: str | None,
              done: Done) -> list[Cell]:
    """The cells one after another in this process, one workload per model shared by its cells."""
    ran: list[Cell] = []
    for model in sweep.models:
        mine = [c for c in todo if c.model == model.name]
        if not mine:
            continue
        done.doing(f"loading {model.name}")
        if model.name not in workloads:
            workloads[model.name] = model_workload(model, sweep.device)
        for cell in mine:
            done.doing(cell_name(cell) + (f" (resuming at {cell.spent:g})" if cell.started else ""))
            outcome = run_cell(sweep, model, cell, workloads[model.name], ray_address)
            if outcome.ok:
                ran.append(cell)
            done.say(cell, outcome)
    return ran


def _write_sweep_report(out: Path) -> None:
    """report.md and report.html beside the table: an extra, so a failure warns and the sweep stands."""
    try:
        write_sweep_report(out)
    except Exception as exc:  # noqa: BLE001 -- an extra: whatever breaks it, the sweep stands
        warnings.warn(f"the sweep finished but its report was not written ({type(exc).__name__}: {exc}); "
                      f"retry with `modelopt report {out}`", stacklevel=3)

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
`make_table(out)` from the journals alone, with each chosen plan re-scored on the test split.
"""
from __future__ import annotations

import contextlib
import fnmatch
import importlib.util
import logging
import os
import warnings
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from modelopt.api import build_workload, optimize
from modelopt.compressors import COMPRESSORS
from modelopt.config.run_config import RunConfig
from modelopt.errors import ConfigError, LoadError, ModeloptError
from modelopt.model.layer_inputs import LayerInputs
from modelopt.model.workload import Workload
from modelopt.reports import write_sweep_report
from modelopt.run.journal import write_json_atomic
from modelopt.run.layout import CONFIG, SWEEP_JSON, TABLE_CSV, TABLE_MD
from modelopt.run.runner import free_cuda_memory
from modelopt.sweep.file import Cell, Sweep, SweepModel, load_sweep
from modelopt.sweep.table import make_table

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


def _build_workload(model: SweepModel, device: str) -> Workload:
    return build_workload(model.model, model.data, weights=model.weights, device=device, unlabeled=model.unlabeled)


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
    console = console or Console(stderr=True)
    workloads = dict(workloads or {})
    todo = _selected([c for c in cells if not c.done], only)
    columns = (TextColumn("[bold]sweep {task.fields[name]}"), BarColumn(), MofNCompleteColumn(), TextColumn("cells"),
               TimeElapsedColumn(), TextColumn("{task.description}"))
    with Progress(*columns, console=console, disable=not progress) as bar:
        task = bar.add_task("", total=len(cells), completed=len(cells) - len(todo), name=sweep.name)
        done = _Done(bar, task, progress)
        if workers > 1 and todo:
            ran = _run_on_ray(sweep, todo, workers, ray_address, workloads, done)
        else:
            with _one_cluster(sweep, todo, ray_address):
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
    names = [_name(c) for c in sweep.cells()]
    for pattern in only:
        if not any(fnmatch.fnmatch(name, pattern) for name in names):
            raise ConfigError(f"--only {pattern!r} matches no cell of sweep {sweep.name!r}; cells are named "
                              f"model/strategy/seedK: {', '.join(names[:4])}{', ...' if len(names) > 4 else ''}")


def _check_workers(workers: int) -> None:
    """Before any work: a count of cells at once that makes sense, and Ray installed when it is needed."""
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise ConfigError(f"--workers must be a positive number of cells run at once, like 2; got {workers!r}")
    if workers > 1 and importlib.util.find_spec("ray") is None:
        raise ConfigError(_RAY_MISSING)


def _selected(todo: list[Cell], only: Sequence[str]) -> list[Cell]:
    """The cells matching any of the `only` patterns (on model/strategy/seedK), in the patterns' order."""
    if not only:
        return todo
    label = {id(c): f"{c.model}/{c.strategy}/seed{c.seed}" for c in todo}
    ordered = [c for pattern in only for c in todo if fnmatch.fnmatch(label[id(c)], pattern)]
    return list({id(c): c for c in ordered}.values())


def _name(cell: Cell) -> str:
    return f"{cell.model}/{cell.strategy}/seed{cell.seed}"


@dataclass(frozen=True)
class _Outcome:
    """How a cell went, in words: what it found, or why it failed (its journal is kept either way)."""

    ok: bool
    text: str
    stops: type[ModeloptError] | None = None  # what stops the serial sweep: bad settings, a model that won't load


@dataclass(frozen=True)
class _Done:
    """The progress bar of cells done, and the lines said as each cell ends."""

    bar: Progress
    task: TaskID
    progress: bool

    def say(self, cell: Cell, outcome: _Outcome) -> None:
        if not outcome.ok:
            self.bar.console.print(f"[red]{_name(cell)} failed:[/] {outcome.text}; rerun the sweep to retry it",
                                   highlight=False)
        elif self.progress:
            self.bar.console.print(f"{_name(cell)}: {outcome.text}", highlight=False)
        self.bar.advance(self.task)

    def doing(self, what: str) -> None:
        self.bar.update(self.task, description=what)


@contextlib.contextmanager
def _one_cluster(sweep: Sweep, todo: Sequence[Cell], ray_address: str | None) -> Iterator[None]:
    """With `workers_per_cell`, one Ray cluster for every cell's evaluations (else each run starts its own)."""
    if sweep.workers_per_cell < 2 or not todo or importlib.util.find_spec("ray") is None:
        yield  # without Ray, the first run says what to install
        return
    import ray

    started = _start_ray(ray, max(sweep.workers_per_cell, os.cpu_count() or 1), ray_address)
    try:
        yield
    finally:
        if started:
            ray.shutdown()


def _run_here(sweep: Sweep, todo: Sequence[Cell], workloads: dict[str, Workload], ray_address: str | None,
              done: _Done) -> list[Cell]:
    """The cells one after another in this process, one workload per model shared by its cells."""
    ran: list[Cell] = []
    for model in sweep.models:
        mine = [c for c in todo if c.model == model.name]
        if not mine:
            continue
        done.doing(f"loading {model.name}")
        if model.name not in workloads:
            workloads[model.name] = _build_workload(model, sweep.device)
        for cell in mine:
            done.doing(_name(cell) + (f" (resuming at {cell.spent:g})" if cell.started else ""))
            outcome = _run_cell(sweep, model, cell, workloads[model.name], ray_address)
            if outcome.ok:
                ran.append(cell)
            done.say(cell, outcome)
    return ran


def _run_cell(sweep: Sweep, model: SweepModel, cell: Cell, wl: Workload, ray_address: str | None) -> _Outcome:
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
        failed = _Outcome(False, f"{type(exc).__name__}: {exc}")
        out_of_memory = isinstance(exc, torch.cuda.OutOfMemoryError)
    else:
        best = result.best
        found = "no feasible plan" if best is None else (
            f"best {best.scored.compression:.2f}x at {best.scored.retention:.2%} val retention")
        return _Outcome(True, f"{len(result.trials)} trials, {found}")
    if out_of_memory:  # past the except clause, whose traceback held the cell's tensors
        free_cuda_memory()
    return failed


# ---- on Ray: one task per cell --------------------------------------------------------------

_RAY_MISSING = "--workers needs Ray: pip install 'modelopt[distributed]'"
_worker_cache: dict[tuple[SweepModel, str], Workload] = {}  # in a Ray worker: the workload its last cell used


@dataclass(frozen=True)
class _Shared:
    """A worker's workload caches on the CPU: merged into the driver's, the table reuses them as in a serial sweep."""

    tensors: dict[tuple[Any, ...], torch.Tensor]
    inputs: dict[int, dict[str, LayerInputs]]

    @classmethod
    def of(cls, wl: Workload) -> _Shared:
        return cls({k: v.cpu() for k, v in wl.tensor_cache.items()},
                   {n: {k: LayerInputs(v.hessian.cpu(), v.rows) for k, v in layers.items()}
                    for n, layers in wl.input_cache.items()})

    def into(self, wl: Workload) -> None:
        for key, t in self.tensors.items():
            wl.tensor_cache.setdefault(key, t.to(wl.device))
        for n, layers in self.inputs.items():
            wl.input_cache.setdefault(n, {k: LayerInputs(v.hessian.to(wl.device), v.rows) for k, v in layers.items()})


def _cell_task(sweep: Sweep, model: SweepModel, cell: Cell, workers: int) -> tuple[_Outcome, _Shared | None]:
    """One cell in a Ray worker process: its share of the CPU threads, its own workload (kept for its next cell)."""
    if not torch.cuda.is_available():  # else the task holds a GPU of its own
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))
    key = (model, sweep.device)
    try:
        if key not in _worker_cache:
            _worker_cache.clear()  # one model's workload at a time in a worker's memory
            _worker_cache[key] = _build_workload(model, sweep.device)
        outcome = _run_cell(sweep, model, cell, _worker_cache[key], None)
    except (ConfigError, LoadError) as exc:  # raised here, it would come back wrapped in Ray's traceback
        return _Outcome(False, str(exc), stops=LoadError if isinstance(exc, LoadError) else ConfigError), None
    return outcome, _Shared.of(_worker_cache[key])


def _run_on_ray(sweep: Sweep, todo: Sequence[Cell], workers: int, ray_address: str | None,
                workloads: dict[str, Workload], done: _Done) -> list[Cell]:
    """Up to `workers` cells at once, one Ray task each; the cells that finished, in `todo`'s order.

    Meanwhile a thread here builds the workloads the table re-scores on, while Ray starts and the cells run."""
    import ray  # present: `_check_workers` looked

    missing = [m for m in sweep.models if m.name not in workloads]
    with ThreadPoolExecutor(1) as pool:
        built = pool.submit(lambda: {m.name: _build_workload(m, sweep.device) for m in missing})
        done.doing("starting Ray")
        started = _start_ray(ray, workers, ray_address)
        try:
            ran, shared = _run_tasks(ray, sweep, todo, workers, done)
        finally:
            if started:
                ray.shutdown()
        done.doing("loading the models for the table")
        workloads.update(built.result())
    for name, caches in shared:
        caches.into(workloads[name])
    return [c for c in todo if id(c) in ran]


def _run_tasks(ray: Any, sweep: Sweep, todo: Sequence[Cell], workers: int,
               done: _Done) -> tuple[set[int], list[tuple[str, _Shared]]]:
    """The cells' tasks, `workers` at a time: the ids of those that finished, and their workers' caches."""
    gpus = 1 if sweep.device != "cpu" and ray.cluster_resources().get("GPU", 0) >= 1 else 0
    task = ray.remote(num_cpus=1, num_gpus=gpus, max_retries=0)(_cell_task)
    models = {m.name: m for m in sweep.models}
    waiting, running, ran, shared = list(todo), dict[Any, Cell](), set[int](), list[tuple[str, _Shared]]()
    while waiting or running:
        while waiting and len(running) < workers:  # at most `workers` at once, even on a larger cluster
            cell = waiting.pop(0)
            running[task.remote(sweep, models[cell.model], cell, workers)] = cell
        done.doing(f"{len(running)} running: " + ", ".join(_name(c) for c in running.values()))
        finished, _ = ray.wait(list(running), num_returns=1)
        for ref in finished:
            cell = running.pop(ref)
            try:
                outcome, caches = ray.get(ref)
            except ray.exceptions.RayError as exc:  # a worker that died (killed, out of memory): a failed cell
                outcome, caches = _Outcome(False, f"{type(exc).__name__}: {str(exc).strip().splitlines()[0]}"), None
            if outcome.stops is not None:  # as the serial sweep stops: the others would fail alike
                for other in running:
                    ray.cancel(other, force=True)
                raise outcome.stops(outcome.text)
            if outcome.ok:
                ran.add(id(cell))
            if caches is not None:
                shared.append((cell.model, caches))
            done.say(cell, outcome)
    return ran, shared


def _start_ray(ray: Any, workers: int, address: str | None) -> bool:
    """Connects to `address`, else starts a local cluster with a CPU per worker; True: the sweep shuts it down."""
    if ray.is_initialized():
        return False
    # Ray starts its workers at niceness 15: on a machine doing anything else they would yield to it.
    os.environ.setdefault("RAY_worker_niceness", "0")
    if address is not None:
        ray.init(address=address, logging_level=logging.WARNING)
    else:
        ray.init(num_cpus=workers, include_dashboard=False, ignore_reinit_error=True, logging_level=logging.WARNING)
    return True


def _write_sweep_report(out: Path) -> None:
    """report.md and report.html beside the table: an extra, so a failure warns and the sweep stands."""
    try:
        write_sweep_report(out)
    except Exception as exc:  # noqa: BLE001 -- an extra: whatever breaks it, the sweep stands
        warnings.warn(f"the sweep finished but its report was not written ({type(exc).__name__}: {exc}); "
                      f"retry with `modelopt report {out}`", stacklevel=3)

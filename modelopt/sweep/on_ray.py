"""A sweep on Ray: up to N cells at once, one task each in a worker process with its own workload
(`run_sweep(..., workers=N)`), or one cluster for every cell's own evaluations (`workers_per_cell`)."""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from modelopt.errors import ConfigError, LoadError
from modelopt.model.layer_inputs import LayerInputs
from modelopt.model.workload import Workload
from modelopt.sweep.cell_run import Done, Outcome, cell_name, model_workload, run_cell
from modelopt.sweep.file import Cell, Sweep, SweepModel

__all__ = ["RAY_MISSING", "one_cluster", "run_on_ray", "start_ray"]

RAY_MISSING = "--workers needs Ray: pip install 'modelopt[distributed]'"
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


def _cell_task(sweep: Sweep, model: SweepModel, cell: Cell, workers: int) -> tuple[Outcome, _Shared | None]:
    """One cell in a Ray worker process: its share of the CPU threads, its own workload (kept for its next cell)."""
    if not torch.cuda.is_available():  # else the task holds a GPU of its own
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))
    key = (model, sweep.device)
    try:
        if key not in _worker_cache:
            _worker_cache.clear()  # one model's workload at a time in a worker's memory
            _worker_cache[key] = model_workload(model, sweep.device)
        outcome = run_cell(sweep, model, cell, _worker_cache[key], None)
    except (ConfigError, LoadError) as exc:  # raised here, it would come back wrapped in Ray's traceback
        return Outcome(False, str(exc), stops=LoadError if isinstance(exc, LoadError) else ConfigError), None
    return outcome, _Shared.of(_worker_cache[key])


def run_on_ray(sweep: Sweep, todo: Sequence[Cell], workers: int, ray_address: str | None,
               workloads: dict[str, Workload], done: Done) -> list[Cell]:
    """Up to `workers` cells at once, one Ray task each; the cells that finished, in `todo`'s order.

    Meanwhile a thread here builds the workloads the table re-scores on, while Ray starts and the cells run."""
    import ray  # present: `modelopt.sweep.run.check_selection` looked

    missing = [m for m in sweep.models if m.name not in workloads]
    with ThreadPoolExecutor(1) as pool:
        built = pool.submit(lambda: {m.name: model_workload(m, sweep.device) for m in missing})
        done.doing("starting Ray")
        started = start_ray(ray, workers, ray_address)
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
               done: Done) -> tuple[set[int], list[tuple[str, _Shared]]]:
    """The cells' tasks, `workers` at a time: the ids of those that finished, and their workers' caches."""
    gpus = 1 if sweep.device != "cpu" and ray.cluster_resources().get("GPU", 0) >= 1 else 0
    task = ray.remote(num_cpus=1, num_gpus=gpus, max_retries=0)(_cell_task)
    models = {m.name: m for m in sweep.models}
    waiting, running, ran, shared = list(todo), dict[Any, Cell](), set[int](), list[tuple[str, _Shared]]()
    while waiting or running:
        while waiting and len(running) < workers:  # at most `workers` at once, even on a larger cluster
            cell = waiting.pop(0)
            running[task.remote(sweep, models[cell.model], cell, workers)] = cell
        done.doing(f"{len(running)} running: " + ", ".join(cell_name(c) for c in running.values()))
        finished, _ = ray.wait(list(running), num_returns=1)
        for ref in finished:
            cell = running.pop(ref)
            try:
                outcome, caches = ray.get(ref)
            except ray.exceptions.RayError as exc:  # a worker that died (killed, out of memory): a failed cell
                outcome, caches = Outcome(False, f"{type(exc).__name__}: {str(exc).strip().splitlines()[0]}"), None
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


def start_ray(ray: Any, workers: int, address: str | None) -> bool:
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


@contextlib.contextmanager
def one_cluster(sweep: Sweep, todo: Sequence[Cell], ray_address: str | None) -> Iterator[None]:
    """With `workers_per_cell`, one Ray cluster for every cell's evaluations (else each run starts its own)."""
    if sweep.workers_per_cell < 2 or not todo or importlib.util.find_spec("ray") is None:
        yield  # without Ray, the first run says what to install
        return
    import ray

    started = start_ray(ray, max(sweep.workers_per_cell, os.cpu_count() or 1), ray_address)
    try:
        yield
    finally:
        if started:
            ray.shutdown()

"""The Ray executor: `workers` actors, each with its own copy of the model, score the driver's jobs.

A worker that dies mid-plan (killed, out of memory, node lost) costs a retry of that plan on
another worker, and is replaced; a plan whose worker died `MAX_DEATHS` times is returned as failed
and the search goes on. Ray is the `distributed` extra: it is imported only here, when a run asks
for this executor.
"""

from __future__ import annotations

import dataclasses
import os
from collections import Counter, deque
from typing import TYPE_CHECKING, Any, ClassVar

from modelopt.errors import ConfigError, ModeloptError
from modelopt.executors._base import Executor, Job, Scored
from modelopt.executors.ray_worker import PlanWorker
from modelopt.model.workload import Workload

if TYPE_CHECKING:  # the config imports modules this package's callers import: its type only
    from modelopt.config.run_config import RunConfig

__all__ = ["MAX_DEATHS", "RayExecutor", "import_ray"]

MAX_DEATHS = 2  # a plan whose worker died this many times is recorded as failed


def import_ray() -> Any:
    """The `ray` module, or one clear line saying how to install it."""
    try:
        import ray
    except ImportError:
        raise ConfigError("executor 'ray' (--workers N, --ray-address) needs Ray: "
                          "pip install 'modelopt[distributed]'") from None
    return ray


class RayExecutor(Executor):
    """Scores jobs on `config.workers` Ray actors (a GPU each when the run is on CUDA and the cluster
    has GPUs; on the CPU, the cores split between them).

    Args:
        config: the run's resolved config (what each worker rebuilds its evaluator from).
        workload: sent to the workers only when the model or data exist only in this process
            (`<in memory>` in the config); otherwise each worker loads its own.
        allow_pickle: as the run was started.
    """

    name: ClassVar[str] = "ray"

    def __init__(self, config: RunConfig, *, workload: Workload | None = None, allow_pickle: bool = False) -> None:
        self._ray = ray = import_ray()
        self.slots = config.workers
        self._started = not ray.is_initialized()
        if self._started:
            # Ray starts workers at niceness 15 by default: on a machine doing anything else they would
            # yield to it and score slower than the local executor. Ours run at the driver's priority.
            os.environ.setdefault("RAY_worker_niceness", "0")
            cpus = None if config.ray_address else max(config.workers, os.cpu_count() or 1)
            _init(ray, address=config.ray_address, num_cpus=cpus, include_dashboard=False, log_to_driver=False,
                  configure_logging=False)
        total = ray.cluster_resources()
        gpus = 1 if config.device.startswith("cuda") and total.get("GPU", 0) >= 1 else 0
        threads = max(1, int(total.get("CPU", 1)) // config.workers)
        in_memory = "<in memory>" in (config.model, config.data)
        payload = ray.put(workload) if in_memory and workload is not None else None
        actor = ray.remote(num_cpus=1, num_gpus=gpus, max_restarts=0)(PlanWorker)
        # A worker sees only the GPU Ray gave it, as cuda:0.
        settings = dataclasses.replace(config, device="cuda" if gpus else config.device).to_json()
        self._spawn = lambda: actor.remote(settings, payload, threads, allow_pickle)
        self._free: list[Any] = []
        self._busy: dict[Any, tuple[Any, Job]] = {}  # object ref -> (actor, job)
        self._queue: deque[Job] = deque()
        self.deaths: Counter[str] = Counter()  # plan key -> workers lost scoring it
        self.pids: dict[Any, int] = {}
        for _ in range(config.workers):
            self._add_worker(first=True)

    def _add_worker(self, *, first: bool = False) -> None:
        worker = self._spawn()
        if first:  # a worker that cannot build its evaluator: the same error the driver would give, at once
            try:
                self.pids[worker] = self._ray.get(worker.ready.remote())
            except self._ray.exceptions.RayTaskError as exc:
                self.close()
                cause = exc.cause if isinstance(exc.cause, ModeloptError) else exc
                raise ModeloptError(f"a Ray worker could not start: {cause}") from None
            except self._ray.exceptions.RayActorError as exc:  # killed while loading (e.g. out of memory)
                self.close()
                raise ModeloptError(f"a Ray worker died while starting ({str(exc).strip().splitlines()[0]})") from None
        self._free.append(worker)

    def worker_pids(self) -> list[int]:
        """The process ids of the workers started so far that have reported ready."""
        return list(self.pids.values())

    def submit(self, job: Job) -> None:
        self._queue.append(job)
        self._dispatch()

    def _dispatch(self) -> None:
        while self._free and self._queue:
            worker, job = self._free.pop(0), self._queue.popleft()
            self._busy[worker.score.remote(job)] = (worker, job)

    def wait(self) -> list[tuple[Job, Scored]]:
        ray = self._ray
        ready, _ = ray.wait(list(self._busy), num_returns=1)
        done: list[tuple[Job, Scored]] = []
        for ref in ready:
            worker, job = self._busy.pop(ref)
            try:
                done.append((job, ray.get(ref)))
                self._free.append(worker)
            except (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError) as exc:
                done.extend(self._lost(worker, job, exc))
        self._dispatch()
        return done

    def _lost(self, worker: Any, job: Job, exc: Exception) -> list[tuple[Job, Scored]]:
        """A worker died scoring `job`: replace it, and retry the job unless it has killed enough workers."""
        self.pids.pop(worker, None)
        self._ray.kill(worker, no_restart=True)
        self._add_worker()
        self.deaths[job.plan.key] += 1
        if self.deaths[job.plan.key] < MAX_DEATHS:
            self._queue.appendleft(job)
            return []
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return [(job, Scored(None, 0.0, error=f"the worker scoring this plan died {MAX_DEATHS} times ({reason})"))]

    def close(self) -> None:
        for worker in [*self._free, *(w for w, _ in self._busy.values())]:
            self._ray.kill(worker, no_restart=True)
        self._free, self._busy = [], {}
        if self._started and self._ray.is_initialized():
            self._ray.shutdown()


START_TRIES = 3  # Ray gives a starting node 30 s to register (fixed in its code); a loaded machine misses that


def _init(ray: Any, **kwargs: Any) -> None:
    """`ray.init`, tried again when a local node timed out while starting (seen on a loaded machine: docs/search.md)."""
    for attempt in range(START_TRIES):
        try:
            ray.init(**kwargs)
            return
        except Exception as exc:  # Ray raises a bare Exception for this one case (re-raised unless it is)
            if "timed out during startup" not in str(exc) or attempt == START_TRIES - 1 or kwargs.get("address"):
                raise
            ray.shutdown()

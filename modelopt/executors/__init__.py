"""Executors: who scores the plans a run asks for (`local`, in this process; `ray`, on workers)."""

from __future__ import annotations

from modelopt.config.build import BuiltRun
from modelopt.executors._base import Executor, Job, Scored
from modelopt.executors.local import LocalExecutor
from modelopt.executors.on_ray import RayExecutor
from modelopt.model.workload import Workload

__all__ = ["Executor", "Job", "LocalExecutor", "RayExecutor", "Scored", "make_executor"]


def make_executor(built: BuiltRun, *, workload: Workload | None = None, allow_pickle: bool = False) -> Executor:
    """The executor `built.config` names, for the run `built` holds (`workload`: what the caller passed
    in, shipped to Ray workers only when it exists nowhere else)."""
    config = built.config
    if config.executor == "ray":
        return RayExecutor(config, workload=workload, allow_pickle=allow_pickle)
    return LocalExecutor(built.evaluator, built.objective, config.fidelity, slots=config.workers)

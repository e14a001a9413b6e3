"""A Ray worker's side: its own workload and evaluator, built once, then one plan scored per call.

The class is plain Python; `modelopt.executors.on_ray` makes it a Ray actor. Each worker charges
every plan's one-time preparations in full (`OneTimeCosts.forget_paid`) and reports them, so the
driver charges each once, to the first trial it records that needed it, as a local run does.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from modelopt.config.build import load_workload, make_evaluator, make_objective
from modelopt.config.run_config import RunConfig
from modelopt.evaluation.priors import measure_errors
from modelopt.executors._base import Job, Scored
from modelopt.executors.scoring import score
from modelopt.model.workload import Workload

__all__ = ["PlanWorker"]


class PlanWorker:
    """Scores plans of the run `config` describes (its resolved run.json form).

    Args:
        config: `RunConfig.to_json()` of the driver's resolved config.
        workload: the driver's workload, for models and data that exist only in its memory; None
            loads them here from `config` (the usual case: nothing large crosses the wire).
        threads: torch CPU threads for this worker (the machine's cores split between workers).
        allow_pickle: as the run was started (full unpickling of the model file).
    """

    def __init__(self, config: dict[str, Any], workload: Workload | None, threads: int,
                 allow_pickle: bool = False) -> None:
        torch.set_num_threads(threads)
        self.config = RunConfig.from_json(config)
        wl = workload if workload is not None else load_workload(self.config, allow_pickle=allow_pickle)
        self.evaluator = make_evaluator(self.config, wl)
        # Every choice's tensors (GPTQ's layer inputs and solves), computed once before the first plan as
        # the driver's build computes them: the first plans do not each wait for them.
        measure_errors(self.evaluator)
        self.objective = make_objective(self.config, wl)

    def ready(self) -> int:
        """The worker's process id, once its workload is loaded (the driver waits on this)."""
        return os.getpid()

    def score(self, job: Job) -> Scored:
        one_time = self.evaluator.one_time
        one_time.forget_paid()
        scored = score(self.evaluator, self.objective, self.config.fidelity, job)
        return Scored(scored.metrics, scored.seconds, scored.error, charges=dict(one_time.since_forget))

"""Scoring one plan for the driver: the work an executor's worker does per job."""

from __future__ import annotations

import gc
import time
import traceback

import torch

from modelopt.data.split import Split
from modelopt.errors import ModeloptError
from modelopt.evaluation.evaluator import Evaluator
from modelopt.evaluation.fidelity import Fidelity
from modelopt.executors._base import Job, Scored
from modelopt.objective import Objective

__all__ = ["free_cuda_memory", "score"]


def score(evaluator: Evaluator, objective: Objective, fidelity: Fidelity | None, job: Job) -> Scored:
    """Scores `job.plan` on val (whole, or in stages under `fidelity`); an exception is caught and
    returned as the job's error: a crashing plan is recorded as failed and the search goes on."""
    t0 = time.perf_counter()
    out_of_memory = False
    try:
        if fidelity is None:
            metrics = evaluator.evaluate(job.plan, split=Split.VAL)
        else:  # a curve's plans stop early only under its lowest floor (`Objective.search`)
            objective = objective.search
            metrics = evaluator.evaluate_staged(job.plan, objective.min_retention, fidelity, finish=job.finish,
                                                confidence=objective.confidence, count_gains=objective.count_gains,
                                                claim_images=objective.claim_images)
        return Scored(metrics, time.perf_counter() - t0)
    except Exception as exc:  # noqa: BLE001 -- a crashing plan is recorded as failed; the search goes on
        error = failure_text(exc)
        out_of_memory = isinstance(exc, torch.cuda.OutOfMemoryError)
    if out_of_memory:  # here, past the except clause: its traceback no longer holds the trial's tensors
        free_cuda_memory()
    return Scored(None, time.perf_counter() - t0, error=error)


def failure_text(exc: BaseException) -> str:
    """A failed trial's one-line reason: the message, with where it was raised for unexpected errors."""
    if isinstance(exc, ModeloptError):
        return str(exc)
    return f"{type(exc).__name__}: {exc} | " + traceback.format_exc(limit=3).strip().splitlines()[-1]


def free_cuda_memory() -> None:
    """Frees what a trial that ran out of CUDA memory left behind, so the next plan does not meet a full
    or fragmented pool: collects the failed trial's unreachable tensors, then hands the caching
    allocator's unused blocks back to the device. A no-op where CUDA was never initialised."""
    gc.collect()
    torch.cuda.empty_cache()

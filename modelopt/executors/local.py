"""The local executor: the driver's own evaluator scores each job in this process, in ask order."""

from __future__ import annotations

from collections import deque
from typing import ClassVar

from modelopt.evaluation.evaluator import Evaluator
from modelopt.evaluation.fidelity import Fidelity
from modelopt.executors._base import Executor, Job, Scored
from modelopt.executors.scoring import score
from modelopt.objective import Objective

__all__ = ["LocalExecutor"]


class LocalExecutor(Executor):
    """Scores one job at a time with `evaluator`. `slots` > 1 keeps that many plans asked ahead
    (the batch a strategy is asked for at once), scored one after another: the same trials
    `slots` Ray workers give, without Ray."""

    name: ClassVar[str] = "local"

    def __init__(self, evaluator: Evaluator, objective: Objective, fidelity: Fidelity | None, *,
                 slots: int = 1) -> None:
        self.evaluator, self.objective, self.fidelity = evaluator, objective, fidelity
        self.slots = slots
        self._queue: deque[Job] = deque()

    def submit(self, job: Job) -> None:
        self._queue.append(job)

    def wait(self) -> list[tuple[Job, Scored]]:
        job = self._queue.popleft()
        return [(job, score(self.evaluator, self.objective, self.fidelity, job))]

"""A run's reconstructions: each plan refitted once, kept in the run folder, adopted by every verb that reads it.

`Refits(evaluator, folder)(plan)` makes the evaluator score, deploy and export `plan` with its reconstructed
weights: from the evaluator's memory, else from `folder/<RECONSTRUCTED>/<plan key's digest>.pt`, else fitted now
(`reconstruct`) and written there before it is adopted, so that a killed run resumes, and export and
`evaluate RUN_DIR` read, what was certified without fitting again.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from pathlib import Path

from modelopt.evaluation.evaluator import Evaluator
from modelopt.evaluation.fitted import Fitted
from modelopt.plan.plan import Plan
from modelopt.reconstruct.own_inputs import Target
from modelopt.reconstruct.plan import IMAGES, reconstruct, targets

__all__ = ["RECONSTRUCTED", "Refits", "fitted_path"]

RECONSTRUCTED = "reconstructed"  # the run folder's sub-folder of reconstructions, one file per plan


def fitted_path(folder: Path, plan_key: str) -> Path:
    """Where a run folder keeps the reconstruction of the plan `plan_key`."""
    return folder / RECONSTRUCTED / f"{hashlib.sha256(plan_key.encode()).hexdigest()[:16]}.pt"


# Layers at this many bits or more, whole and dense, are left as composed: an INT8 plan's answers barely move (the
# default run's INT8 anchor changed 0.21 % of confirm answers before and after).
LEFT_AT_BITS = 8


def _worth_it(goals: Mapping[str, Target]) -> bool:
    """Whether any layer is pruned, masked or below `LEFT_AT_BITS` bits: else reconstruction is not run."""
    return any(t.grid is None or t.keep is not None or t.rows is not None or t.cols is not None
               or t.grid.integer.bits < LEFT_AT_BITS for t in goals.values())


class Refits:
    """Reconstructs plans for one evaluator, keeping each in `folder` (None: in memory only).

    Example:
        >>> refit = Refits(ev, Path("runs/r20"))
        >>> refit(plan)                      # fitted, written, adopted; a second call reads nothing
        >>> ev.scorer.evaluate(plan, split="confirm")
    """

    def __init__(self, evaluator: Evaluator, folder: Path | None = None, images: int = IMAGES,
                 progress: Callable[[str], None] | None = None) -> None:
        self.evaluator, self.folder, self.images, self.progress = evaluator, folder, images, progress

    def stored(self, plan: Plan) -> bool:
        """Whether the plan's reconstruction is adopted, or kept in the folder."""
        if self.evaluator.states.fitted(plan) is not None:
            return True
        return self.folder is not None and fitted_path(self.folder, plan.key).is_file()

    def load(self, plan: Plan) -> bool:
        """Adopts the plan's kept reconstruction; False when there is none (the plan then runs as composed)."""
        if self.evaluator.states.fitted(plan) is not None:
            return True
        if self.folder is None or not (path := fitted_path(self.folder, plan.key)).is_file():
            return False
        fitted = Fitted.load(path, self.evaluator.workload.device)
        self.evaluator.adopt(fitted)
        return True

    def __call__(self, plan: Plan) -> Fitted | None:
        """Adopts the plan's reconstruction, fitting and keeping it first when there is none (None: the plan
        has nothing to refit)."""
        if self.load(plan):
            return self.evaluator.states.fitted(plan)
        if not _worth_it(targets(self.evaluator, plan)):
            return None
        fitted = reconstruct(self.evaluator, plan, self.images)
        self.evaluator.one_time.timed("reconstruct", fitted.seconds)  # the finalists' refits, added up
        if self.progress:
            self.progress(f"reconstructed {len(fitted.weights)} of {len(fitted.errors)} layers on {fitted.images} "
                          f"calibration images in {fitted.seconds:.1f} s")
        if self.folder is not None:
            fitted.save(fitted_path(self.folder, plan.key))
        self.evaluator.adopt(fitted)
        return fitted

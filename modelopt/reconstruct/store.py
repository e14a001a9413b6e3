"""A run's reconstructions: each plan refitted once, kept in the run folder, read by every verb that runs it.

`Refits(evaluator, folder)(plan)` is the refit `plan` runs with (`Evaluator.realise(plan, fitted)`): from memory,
else from `folder/<RECONSTRUCTED>/<plan key's digest>.pt`, else fitted now (`reconstruct`) and written there, so that
a killed run resumes, and export and `evaluate RUN_DIR` read, what was certified without fitting again.
`Refits.realise(plan)` is the plan as the run certified it: with its refit where it was chosen, else as composed.
"""

from __future__ import annotations

import hashlib
import json
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path

from modelopt._files import write_json_atomic
from modelopt.data.split import Split
from modelopt.errors import LoadError
from modelopt.evaluation.evaluator import Evaluator, Realised
from modelopt.evaluation.fitted import Fitted
from modelopt.plan.plan import Plan
from modelopt.reconstruct.own_inputs import LayerGoal
from modelopt.reconstruct.plan import IMAGES, reconstruct, targets

__all__ = ["DIGESTS", "HELD_OUT", "MIN_HELD_OUT", "RECONSTRUCTED", "Refits", "checked", "fitted_path"]

RECONSTRUCTED = "reconstructed"  # the run folder's sub-folder of reconstructions, one file per plan
# What each reconstruction file must hold, written beside the folder (a copy of the run's files without the folder
# still says what is missing): {plan key: {"file": its name, "sha256": its digest}}.
DIGESTS = "reconstructed.json"


def fitted_path(folder: Path, plan_key: str) -> Path:
    """Where a run folder keeps the reconstruction of the plan `plan_key`."""
    return folder / RECONSTRUCTED / f"{hashlib.sha256(plan_key.encode()).hexdigest()[:16]}.pt"


# Layers at this many bits or more, whole and dense, are left as composed: an INT8 plan's answers barely move, and
# reconstruction does not move them (measured: docs/reconstruction.md#measured).
LEFT_AT_BITS = 8


# Calibration images after the refit's own that check it against the plan as composed (`Fitted.chosen`): at most
# HELD_OUT; with fewer than MIN_HELD_OUT left the refit is kept unchecked.
HELD_OUT = 1000
MIN_HELD_OUT = 200


def _verdict(fitted: Fitted) -> str:
    """The held-out check, as a progress line ends."""
    if fitted.held_out is None:
        return " (too few calibration images left to check it: kept)"
    n, composed, refit, _ = fitted.held_out
    kept = "kept" if fitted.chosen else "dropped (it harms): the plan runs as composed"
    return f"; answers changed on {n} held-out calibration images {composed} composed -> {refit} refitted: {kept}"


def _worth_it(goals: Mapping[str, LayerGoal]) -> bool:
    """Whether any layer is pruned, masked or below `LEFT_AT_BITS` bits: else reconstruction is not run."""
    return any(t.grid is None or t.keep is not None or t.rows is not None or t.cols is not None
               or (t.grid.integer.bits if t.bits is None else t.bits) < LEFT_AT_BITS for t in goals.values())


class Refits:
    """Reconstructs plans for one evaluator, keeping each in `folder` (None: in memory only).

    Example:
        >>> refit = Refits(ev, Path("runs/r20"))
        >>> fitted = refit(plan)                   # fitted, checked, written; a second call reads nothing
        >>> ev.evaluate(refit.realise(plan), split="confirm")
    """

    def __init__(self, evaluator: Evaluator, folder: Path | None = None, images: int = IMAGES,
                 progress: Callable[[str], None] | None = None) -> None:
        self.evaluator, self.folder, self.images, self.progress = evaluator, folder, images, progress
        self.tried: dict[str, Fitted] = {}  # plan key -> its refit as fitted or read here, chosen or not

    def stored(self, plan: Plan) -> bool:
        """Whether the plan's reconstruction is known here, or kept in the folder."""
        if plan.key in self.tried:
            return True
        return self.folder is not None and fitted_path(self.folder, plan.key).is_file()

    def recorded(self, plan: Plan) -> bool:
        """Whether the run recorded a reconstruction file for the plan (`DIGESTS`), present or not."""
        return self.folder is not None and plan.key in _digests(self.folder)

    def load(self, plan: Plan) -> Fitted | None:
        """The plan's kept reconstruction, chosen or not (`Fitted.chosen`), from memory or the folder; None when
        there is none. A file whose bytes are not those the run recorded when it wrote it (damaged, or another
        plan's) is refused in one line before it is read."""
        if plan.key in self.tried:
            return self.tried[plan.key]
        if self.folder is None or not (path := fitted_path(self.folder, plan.key)).is_file():
            return None
        want = _digests(self.folder).get(plan.key, {}).get("sha256")
        if want is not None and _sha256(path) != want:
            raise LoadError(f"{str(path)!r} is not the reconstruction the run wrote for plan {plan.key} (its sha256 "
                            f"differs from {DIGESTS}'s: damaged or replaced); delete it and `modelopt optimize --out "
                            f"{str(self.folder)!r} --resume` refits it (export and evaluate then refit it too)")
        fitted = self.tried[plan.key] = Fitted.load(path, self.evaluator.workload.device)
        if fitted.plan_key != plan.key:
            raise LoadError(f"{str(path)!r} holds the reconstruction of plan {fitted.plan_key}, not of {plan.key}; "
                            "delete it and the plan is refitted")
        return fitted

    def chosen(self, plan: Plan) -> Fitted | None:
        """The kept reconstruction the plan runs with (None: none is kept, or it was not chosen: as composed)."""
        fitted = self.load(plan)
        return fitted if fitted is not None and fitted.chosen else None

    def realise(self, plan: Plan) -> Realised:
        """The plan as the run runs it: with its kept, chosen reconstruction, else as composed. A reconstruction the
        run recorded whose file is gone (a copy without the folder, a deleted file) is refitted as the run fitted it,
        and said in one line: the plan is never run as composed in place of what was certified."""
        if (self.recorded(plan) and not self.stored(plan)) and self.folder is not None:
            warnings.warn(f"{str(fitted_path(self.folder, plan.key))!r} (the reconstruction the run certified plan "
                          f"{plan.key} with) is missing: refitting it as the run did", UserWarning, stacklevel=2)
            return self.evaluator.realise(plan, self(plan))
        return self.evaluator.realise(plan, self.chosen(plan))

    def __call__(self, plan: Plan) -> Fitted | None:
        """The reconstruction the plan runs with, fitting, checking and keeping it first when there is none (None:
        the plan has nothing to refit, or its refit changed more held-out answers than the plan as composed)."""
        if self.stored(plan):
            return self.chosen(plan)
        t0 = time.perf_counter()
        goals = targets(self.evaluator, plan)
        if not _worth_it(goals):
            return None
        fitted = reconstruct(self.evaluator, plan, self.images, goals=goals)
        fitted = self.tried[plan.key] = checked(self.evaluator, plan, fitted)
        seconds = time.perf_counter() - t0
        self.evaluator.one_time.timed("reconstruct", seconds)  # the finalists' refits and checks, added up
        if self.progress:
            self.progress(f"reconstructed {len(fitted.weights)} of {len(fitted.errors)} layers on {fitted.images} "
                          f"calibration images in {seconds:.1f} s{_verdict(fitted)}")
        if self.folder is not None:
            path = fitted_path(self.folder, plan.key)
            fitted.save(path)
            digests = _digests(self.folder)
            digests[plan.key] = {"file": path.name, "sha256": _sha256(path)}
            write_json_atomic(self.folder / DIGESTS, digests)
        return fitted if fitted.chosen else None


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _digests(folder: Path) -> dict[str, dict[str, str]]:
    """The run's record of its reconstruction files (`DIGESTS`); empty for a run from before it was kept."""
    try:
        raw = json.loads((folder / DIGESTS).read_text(encoding="utf-8"))
    except (OSError, ValueError):  # none yet (or unreadable: nothing to check against)
        return {}
    return {str(k): dict(v) for k, v in raw.items() if isinstance(v, dict)} if isinstance(raw, dict) else {}


def checked(evaluator: Evaluator, plan: Plan, fitted: Fitted) -> Fitted:
    """`fitted` with its held-out check (`Fitted.held_out`), which says whether the plan runs with it
    (`Fitted.chosen`) or as composed.

    The check counts answers changed against the float model on up to `HELD_OUT` calibration images after those
    the refit read (GPTQ's and the other per-layer fits read the first ones too), which no search scored: neither
    side is favoured. None where fewer than `MIN_HELD_OUT` are left.
    """
    calib = evaluator.workload.split(Split.CALIB).x
    if len(calib) - fitted.images < MIN_HELD_OUT:
        return fitted
    x = calib.part(fitted.images, min(len(calib), fitted.images + HELD_OUT))
    float_top1 = evaluator.workload.predict(x)
    composed = evaluator.answers_on(plan, x)[0] != float_top1
    refit = evaluator.answers_on(evaluator.realise(plan, fitted), x)[0] != float_top1
    return replace(fitted, held_out=(len(x), int(composed.sum()), int(refit.sum()), int((composed != refit).sum())))

"""Deployed equals certified: the plan a run reports is built afresh as a user deploys it, by the run's engine
(`Engine.deployed`: the file `modelopt export` writes in a new session of the engine; with the torch engine,
the deployable module), and its answers on the test split are compared with the answers the run scored; a plan
whose deployed answers disagree beyond the tolerance (`LatencySpec.min_agreement`) is not reported as the best:
the next confirmed plan is checked instead. An engine that cannot build a plan as deployed stops the check
(NotImplementedError naming it): no other runtime stands in for it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from modelopt.data.split import Split
from modelopt.evaluation.evaluator import Realised
from modelopt.evaluation.trial import Trial
from modelopt.latency.plan import PlanLatency
from modelopt.plan.plan import Plan

__all__ = ["Deployed", "check_deployed", "deployed_agreement"]

SPLIT = Split.TEST


@dataclass(frozen=True)
class Deployed:
    """How the reported plan's deployed answers compared with the certified ones."""

    engine: str  # the latency figure's name: engine/device/precision/batch
    split: str
    agreement: float | None  # share of images with the same top-1; None when no plan was checked
    min_agreement: float
    checked: int  # plans checked before one held (or none did)

    def to_json(self) -> dict[str, object]:
        return {"engine": self.engine, "split": self.split, "agreement": self.agreement,
                "min_agreement": self.min_agreement, "checked": self.checked}


def deployed_agreement(latency: PlanLatency, plan: Plan | Realised, split: str = SPLIT) -> float:
    """The share of `split`'s images on which the plan, built afresh as a user deploys it in the run's engine,
    gives the top-1 the run scored (the engine's, when the run scores in its engine; else the PyTorch
    simulation's).

    Raises:
        NotImplementedError: the engine does not build plans as deployed (`Engine.deployed`).
    """
    ev = latency.evaluator
    r = ev.realise(plan)
    scored = ev.answers(r, split)[0]
    deployed = latency.engine.deployed(ev, r).run(ev.workload.split(split).x).argmax(1)
    return float((scored.cpu() == deployed.cpu()).double().mean())


def check_deployed(latency: PlanLatency, candidates: Sequence[Trial], realise: Callable[[Plan], Realised] | None = None
                   ) -> tuple[Trial | None, Deployed]:
    """The first of `candidates` (the run's best, then the other confirmed plans, best first) whose deployed
    answers agree with its certified ones on at least `min_agreement` of the test images; `realise`: each plan
    as it was certified (None: as composed)."""
    floor = latency.spec.min_agreement
    agreement: float | None = None
    for i, trial in enumerate(candidates):
        agreement = deployed_agreement(latency, trial.plan if realise is None else realise(trial.plan))
        if agreement >= floor:
            return trial, Deployed(latency.name, SPLIT, agreement, floor, i + 1)
    return None, Deployed(latency.name, SPLIT, agreement, floor, len(candidates))

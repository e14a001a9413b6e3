"""Where images leave a plan with early exits, beside where they leave the float model with the same exits: per
exit, the share of the images that leave there and the accuracy of those images. It shows whether compression
moved the exits (low precision erodes the confidences exits rely on): the question quantization composed with
early exit raises. Both are computed as the run scores (in its engine, when it scores in one), on the test split.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from modelopt.data.split import Split
from modelopt.evaluation.evaluator import Evaluator, Realised
from modelopt.plan.plan import Plan

__all__ = ["ExitPattern", "ExitRow", "exit_pattern"]

END = "end"  # the row of the images that ran the whole network


@dataclass(frozen=True)
class ExitRow:
    """The images that left at one exit (or ran to the end): their share of the split and their accuracy."""

    exit: str
    share: float
    accuracy: float | None  # None: no image left there

    def to_json(self) -> dict[str, Any]:
        return {"exit": self.exit, "share": self.share, "accuracy": self.accuracy}


@dataclass(frozen=True)
class ExitPattern:
    """Per exit, for the float model with the plan's exits (`float`) and for the plan itself (`plan`)."""

    split: str
    images: int
    float: tuple[ExitRow, ...]
    plan: tuple[ExitRow, ...]

    def to_json(self) -> dict[str, Any]:
        return {"split": self.split, "images": self.images, "float": [r.to_json() for r in self.float],
                "plan": [r.to_json() for r in self.plan]}

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> ExitPattern | None:
        if not d:
            return None
        return cls(str(d["split"]), int(d["images"]), _rows(d["float"]), _rows(d["plan"]))


def exit_pattern(evaluator: Evaluator, plan: Plan | Realised, split: str = Split.TEST) -> ExitPattern | None:
    """The exit pattern of `plan` and of the float model under the same exits on `split`; None without exits.

    Example:
        >>> p = exit_pattern(ev, best)
        >>> [(r.exit, round(r.share, 3)) for r in p.plan]
        [('layer2.2', 0.165), ('end', 0.835)]
    """
    routes, r = evaluator.routes, evaluator.realise(plan)
    if r.route is None:
        return None
    names = [t.name for t in routes.taps(evaluator.workload.model, r.plan)]
    exits_only = evaluator.space.plan({n: r.plan.get(n) for n in routes.decisions})
    y = evaluator.workload.split(split).y
    rows = {}
    for which, p in (("float", exits_only), ("plan", r)):
        pred, exit_at = evaluator.answers(p, split)
        assert exit_at is not None, "a routed plan's answers say where each image left"
        rows[which] = _pattern(pred.cpu(), exit_at.cpu(), y.cpu(), names)
    return ExitPattern(split, len(y), rows["float"], rows["plan"])


def _pattern(pred: torch.Tensor, exit_at: torch.Tensor, y: torch.Tensor, names: Sequence[str]) -> tuple[ExitRow, ...]:
    out = []
    for k, name in enumerate([*names, END]):
        here = exit_at == k
        count = int(here.sum())
        accuracy = float((pred[here] == y[here]).double().mean()) if count else None
        out.append(ExitRow(name, count / max(1, len(y)), accuracy))
    return tuple(out)


def _rows(raw: Sequence[Mapping[str, Any]]) -> tuple[ExitRow, ...]:
    return tuple(ExitRow(str(r["exit"]), float(r["share"]), None if r.get("accuracy") is None
                         else float(r["accuracy"])) for r in raw)

"""What one run learned per layer, as the knowledge store keeps it (`RunLessons`), and how it is
read off a finished run (`learn`).

Per (layer, compressor) decision: the layer's fingerprint, each choice's measured error on the
layer (`SearchSpace.features`, from `modelopt.evaluation.priors.measure_errors`), and the run's sensitivities
from MCTS's loss model (`modelopt.search.loss_model`) refitted on every trial of the run, whatever
the strategy: the layer's sensitivity kappa_d and each choice's residual beta, both *relative to the
run's global kappa* (with their posterior std). Relative, because what transfers between models is
which layers are fragile; the overall scale differs with depth (ResNet-56 has three times
ResNet-20's layers, each nudging accuracy less) and a run learns it from its own first trials.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from modelopt.evaluation.evaluator import Evaluator
from modelopt.evaluation.trial import Trial
from modelopt.knowledge.fingerprint import LayerPrint, model_family
from modelopt.plan.plan import Choice, jsonable
from modelopt.plan.space import SearchSpace
from modelopt.search.loss_model import LossModel

__all__ = ["ChoiceLesson", "LayerLesson", "RunLessons", "choice_key", "learn", "loss_measure"]


def choice_key(choice: Choice) -> str:
    """A choice's stable text form (its plan-key JSON), the same in every run that offers it."""
    return json.dumps(jsonable(choice, for_key=True), sort_keys=True, separators=(",", ":"))


def loss_measure(net: bool) -> str:
    """What the sensitivities measure (`Objective.point_retention`): the share of the float model's right
    answers a plan breaks ("broken", under a confidence bound), or its net retention drop ("net", point
    estimates); runs of one measure only mix."""
    return "net" if net else "broken"


@dataclass(frozen=True)
class ChoiceLesson:
    error: float  # the choice's measured relative error on the layer
    beta_rel: float  # residual loss beyond kappa_d x error, relative to the run's kappa
    beta_rel_std: float


@dataclass(frozen=True)
class LayerLesson:
    layer: str
    compressor: str
    print: LayerPrint
    kd_rel: float  # the layer's sensitivity relative to the run's kappa (1: an average layer)
    kd_rel_std: float
    choices: dict[str, ChoiceLesson] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"layer": self.layer, "compressor": self.compressor, "print": self.print.to_json(),
                "kd_rel": self.kd_rel, "kd_rel_std": self.kd_rel_std,
                "choices": {k: [c.error, c.beta_rel, c.beta_rel_std] for k, c in self.choices.items()}}

    @classmethod
    def from_json(cls, raw: Any) -> LayerLesson:
        """Raises ValueError (or KeyError, TypeError) on a malformed entry; the reader names the file."""
        if not isinstance(raw, dict) or not isinstance(raw.get("choices"), dict):
            raise ValueError("a layer entry needs its choices")
        choices = {}
        for key, values in raw["choices"].items():
            if not isinstance(values, list) or len(values) != 3:
                raise ValueError(f"choice {key} needs [error, beta_rel, beta_rel_std]")
            choices[key] = ChoiceLesson(*(_number(v) for v in values))
        return cls(str(raw["layer"]), str(raw["compressor"]), LayerPrint.from_json(raw["print"]),
                   _number(raw["kd_rel"]), _number(raw["kd_rel_std"]), choices)


def _number(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"{v!r} is not a number")
    return float(v)


@dataclass(frozen=True)
class RunLessons:
    """One run's contribution to a store: replaced, not added, when the same run is recorded again."""

    run: str  # host:absolute run folder
    model: str
    family: str
    measure: str
    trials: int
    kappa: float  # the run's global sensitivity (sqrt(drop) per unit of relative error)
    layers: tuple[LayerLesson, ...]

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "family": self.family, "measure": self.measure, "trials": self.trials,
                "kappa": self.kappa, "layers": [entry.to_json() for entry in self.layers]}

    @classmethod
    def from_json(cls, run: str, raw: Any) -> RunLessons:
        if not isinstance(raw, dict) or not isinstance(raw.get("layers"), list):
            raise ValueError("a run entry needs its layers")
        trials = raw.get("trials")
        if not isinstance(trials, int) or isinstance(trials, bool):
            raise ValueError("a run entry's trials must be an integer")
        return cls(run, str(raw["model"]), str(raw["family"]), str(raw["measure"]), trials, _number(raw["kappa"]),
                   tuple(LayerLesson.from_json(e) for e in raw["layers"]))


def _retention(trial: Trial, net: bool) -> float | None:
    """The loss model's target for a trial (`Objective.point_retention`); None for a failed trial."""
    m = trial.metrics
    if m is None or trial.reward is None:
        return None
    c = m.counts()
    if c is None or net or c.base_right <= 0:
        return float(m.retention)
    return 1.0 - c.lost / c.base_right


def _fitted(space: SearchSpace, trials: Sequence[Trial], net: bool) -> tuple[LossModel, int]:
    """MCTS's loss model fitted on a run's completed trials (weighted by the share of val each scored)."""
    decisions = space.decisions
    errors = [np.nan_to_num(np.array([f.error for f in space.features[d.name]], dtype=float), nan=1.0, posinf=1.0)
              for d in decisions]
    width = max(len(d.choices) for d in decisions)
    model = LossModel(errors, [[c is None for c in d.choices] for d in decisions], width)
    rows = [(t, r) for t in trials if (r := _retention(t, net)) is not None]
    idx = np.array([[d.choices.index(t.plan.get(d.name)) for d in decisions] for t, _ in rows], dtype=int)
    weight = [1.0 if t.metrics is None or t.metrics.stopped is None else float(min(max(t.cost, 0.05), 1.0))
              for t, _ in rows]
    model.fit(idx.reshape(len(rows), len(decisions)), np.array([r for _, r in rows], dtype=float),
              np.array(weight, dtype=float))
    return model, len(rows)


def learn(run: str, trials: Sequence[Trial], confidence: float, evaluator: Evaluator) -> RunLessons | None:
    """What a run's `trials` teach about each layer of `evaluator`'s space (`confidence`: the run's, 0 for
    point estimates); None when no trial completed."""
    space, workload = evaluator.space, evaluator.workload
    net = confidence <= 0
    if not space.decisions:
        return None
    model, n = _fitted(space, trials, net)
    if n == 0:
        return None
    kappa = float(model.kappa)
    columns = iter(range(model.n_cols))  # LossModel's columns: one per (decision, non-None choice), in order
    layers = []
    for i, d in enumerate(space.decisions):
        kind = space.layers[d.layer].kind
        lp = LayerPrint.of(getattr(kind, "value", str(kind)), workload.original[d.layer])
        choices = {}
        for c, f in zip(d.choices, space.features[d.name], strict=True):
            if c is not None:
                k = next(columns)
                choices[choice_key(c)] = ChoiceLesson(float(f.error), float(model.beta_mean[k]) / kappa,
                                                      float(model.beta_std[k]) / kappa)
        layers.append(LayerLesson(d.layer, d.compressor, lp, float(model.kd_mean[i]) / kappa,
                                  float(model.kd_std[i]) / kappa, choices))
    return RunLessons(run, workload.name, model_family(workload.name), loss_measure(net), n, kappa,
                      tuple(layers))

"""Where MCTS aims in a curve run (`--floors`): its rollouts at each floor in turn, and a trial's value over the floors.

A one-floor run aims every rollout at its floor and values a trial at it (`mcts_tree.trial_value`). A curve run wants
the best plan at every floor, so the search works towards each: the k-th plan asked is a rollout aimed at floor
k mod (number of floors), the floors highest first, each floor with its own margin (the share of its allowed drop its
rollouts aim at, adapted on the plans aimed there: the loss model's calibration differs between a plan that changes
few answers and one that changes many). A plan that clears the lowest floor is worth 1 + ln(reduction) x (the share
of the floors it clears) to the tree, its share of the curve's area (ln compression at each floor it clears); one
that clears none is valued as in a one-floor run, below 1. So a line of the tree that leads to plans for several
floors is worth more than one that serves only the lowest.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from modelopt.evaluation.trial import Trial
from modelopt.objective import Objective
from modelopt.search.mcts_tree import trial_value

__all__ = ["MAX_MARGIN", "Aim"]

MAX_MARGIN = 1.3  # the largest share of a floor's allowed drop rollouts aim at (the least: mcts.MIN_MARGIN)


@dataclass
class Aim:
    """The floors a search works towards (highest first), each floor's margin, and which floor each plan in flight
    was aimed at (by plan key)."""

    floors: tuple[float, ...]
    margins: list[float] = field(default_factory=list)
    asked: int = 0
    aimed: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.margins = self.margins or [1.0] * len(self.floors)

    @property
    def curve(self) -> bool:
        return len(self.floors) > 1

    def next(self) -> int:
        """The index of the floor the next plan is aimed at (round robin in the order plans are asked)."""
        return self.asked % len(self.floors)

    def asked_for(self, key: str, floor: int) -> None:
        """Plan `key` was asked, its rollout aimed at floor index `floor`."""
        self.asked += 1
        if self.curve:
            self.aimed[key] = floor

    def value(self, trial: Trial, objective: Objective) -> float:
        """The trial's value to the tree (`objective`: the search's, at the lowest floor): in a one-floor run its value
        at the floor (`trial_value`); in a curve run, for a plan that clears the lowest floor, 1 + ln(reduction)
        times the share of the floors it clears (its share of the curve's area), and below 1 as before otherwise."""
        value = trial_value(trial, objective)
        if not self.curve or not trial.meets_floor or trial.metrics is None:
            return value
        cleared = sum(objective.at(f).meets_floor(trial.metrics) for f in self.floors)
        return 1.0 + (value - 1.0) * cleared / len(self.floors)

    def told(self, trial: Trial, objective: Objective, low: float, learn: bool = True) -> None:
        """Adapts the margin of the floor `trial` was aimed at (the search's floor for a plan not asked), so that
        about half of the plans aimed at each floor clear it (one measurement is noisy there); `low`: the least
        margin. `learn` False (a failed trial): only forgets where it was aimed."""
        i = self.aimed.pop(trial.plan.key, len(self.floors) - 1)
        if not learn:
            return
        meets = trial.meets_floor if not self.curve or trial.metrics is None else \
            objective.at(self.floors[i]).meets_floor(trial.metrics)
        self.margins[i] = float(np.clip(self.margins[i] * (1.04 if meets else 0.95), low, MAX_MARGIN))

    def state_dict(self) -> dict[str, Any]:
        return {"floors": list(self.floors), "margins": self.margins, "asked": self.asked, "aimed": self.aimed}

    @classmethod
    def restored(cls, state: dict[str, Any], floors: tuple[float, ...]) -> Aim:
        """The aim a saved state held, if it worked towards `floors` (else a fresh one: the state of another run)."""
        if [float(f) for f in state.get("floors", ())] != list(floors):
            return cls(floors)
        return cls(floors, [float(m) for m in state["margins"]], int(state["asked"]),
                   {str(k): int(v) for k, v in state["aimed"].items()})


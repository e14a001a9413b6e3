"""Random search: every decision drawn uniformly and independently."""

from __future__ import annotations

from typing import Any

import numpy as np

from modelopt.evaluation.trial import Trial
from modelopt.objective import Objective
from modelopt.plan.plan import Plan
from modelopt.plan.space import SearchSpace
from modelopt.search._base import Strategy
from modelopt.search._registry import STRATEGIES


@STRATEGIES.register("random")
class RandomSearch(Strategy):
    """Uniform random plans; seeded, so a run can be repeated exactly.

    Example:
        >>> RandomSearch(space, Objective(), seed=0).ask(2)
    """

    name = "random"

    def __init__(self, space: SearchSpace, objective: Objective, *, seed: int = 0) -> None:
        super().__init__(space, objective, seed=seed)
        self.rng = np.random.default_rng(seed)

    def ask(self, n: int = 1) -> list[Plan]:
        plans = []
        for _ in range(n):
            picks = {d.name: d.choices[int(self.rng.integers(len(d.choices)))] for d in self.space.decisions}
            plans.append(self.space.plan(picks))
        return plans

    def tell(self, trial: Trial) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        return {"rng": self.rng.bit_generator.state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rng.bit_generator.state = state["rng"]
